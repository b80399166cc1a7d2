//! The meta table: for each event, its batch, its inclusive row range in that batch
//! file, and (train split only) its labels.

use std::path::{Path, PathBuf};

use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;

use super::columns::{ColumnSpec, Kind, ParquetSource};
use crate::error::{Error, Result};

/// One meta row, for one event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetaRow {
    /// The event id.
    pub event_id: i64,
    /// First row of the event in its batch file.
    pub first_row: i64,
    /// Last row of the event in its batch file (inclusive, as in the Kaggle files).
    pub last_row: i64,
    /// Azimuth label in radians, `NaN` when the split has no labels.
    pub azimuth: f64,
    /// Zenith label in radians, `NaN` when the split has no labels.
    pub zenith: f64,
}

/// The meta rows of one batch, sorted by `first_row`.
#[derive(Debug, Clone)]
pub struct BatchMeta {
    /// The meta file(s) the rows came from, for error messages.
    pub source: PathBuf,
    /// Rows in pulse order.
    pub rows: Vec<MetaRow>,
}

const BATCH_ID: ColumnSpec = ColumnSpec {
    name: "batch_id",
    kind: Kind::Int,
};
const EVENT_ID: ColumnSpec = ColumnSpec {
    name: "event_id",
    kind: Kind::Int,
};
const FIRST: ColumnSpec = ColumnSpec {
    name: "first_pulse_index",
    kind: Kind::Int,
};
const LAST: ColumnSpec = ColumnSpec {
    name: "last_pulse_index",
    kind: Kind::Int,
};
const AZIMUTH: ColumnSpec = ColumnSpec {
    name: "azimuth",
    kind: Kind::Float,
};
const ZENITH: ColumnSpec = ColumnSpec {
    name: "zenith",
    kind: Kind::Float,
};

/// Whether the meta files carry labels (`azimuth` and `zenith`); all must agree.
pub fn has_labels(meta_files: &[PathBuf]) -> Result<bool> {
    let mut answer: Option<(bool, &PathBuf)> = None;
    for path in meta_files {
        let source = ParquetSource::open(path)?;
        let labels = source.has_column(AZIMUTH.name) && source.has_column(ZENITH.name);
        if let Some((earlier, earlier_path)) = answer {
            if earlier != labels {
                return Err(Error::Layout {
                    path: path.clone(),
                    problem: format!(
                        "has{} azimuth/zenith labels but {} has{}",
                        if labels { "" } else { " no" },
                        earlier_path.display(),
                        if earlier { "" } else { " none" }
                    ),
                });
            }
        }
        answer = Some((labels, path));
    }
    Ok(answer.is_some_and(|(labels, _)| labels))
}

/// Reads the rows of `path` (only row groups `groups`, all when `None`) and hands each
/// row of a `wanted` batch to `row` with its batch id and row number, after validating it;
/// stops at the first invalid one with an error naming the file, row and column. Rows of
/// other batches are neither validated nor passed on.
pub fn scan_meta_file(
    path: &Path,
    labels: bool,
    groups: Option<Vec<usize>>,
    wanted: impl Fn(i64) -> bool,
    mut row: impl FnMut(i64, u64, MetaRow) -> Result<()>,
) -> Result<()> {
    let mut specs = vec![BATCH_ID, EVENT_ID, FIRST, LAST];
    if labels {
        specs.extend([AZIMUTH, ZENITH]);
    }
    let source = ParquetSource::open(path)?;
    for columns in source.read(&specs, groups, 64 * 1024)? {
        let columns = columns?;
        let (batch, event, first, last) = (
            columns.int(0),
            columns.int(1),
            columns.int(2),
            columns.int(3),
        );
        for i in 0..columns.len {
            if !wanted(batch[i]) {
                continue;
            }
            let at = columns.first_row + i as u64;
            let (azimuth, zenith) = if labels {
                (columns.float(4)[i], columns.float(5)[i])
            } else {
                (f64::NAN, f64::NAN)
            };
            if labels {
                for (name, v) in [(AZIMUTH.name, azimuth), (ZENITH.name, zenith)] {
                    if !v.is_finite() {
                        return Err(bad_value(
                            path,
                            at,
                            name,
                            format!("label {v} of event {} is not finite", event[i]),
                        ));
                    }
                }
            }
            if first[i] < 0 || last[i] < first[i] {
                return Err(bad_value(
                    path,
                    at,
                    FIRST.name,
                    format!(
                        "event {}: pulse range {}..={} is empty or negative",
                        event[i], first[i], last[i]
                    ),
                ));
            }
            row(
                batch[i],
                at,
                MetaRow {
                    event_id: event[i],
                    first_row: first[i],
                    last_row: last[i],
                    azimuth,
                    zenith,
                },
            )?;
        }
    }
    Ok(())
}

/// Rows of every meta file whose statistics say they may hold `batch_id` (all rows of a
/// file without statistics): what [`read_batch_meta`] decodes for that batch.
pub fn candidate_rows(meta_files: &[PathBuf], batch_id: i64) -> Result<u64> {
    let mut rows = 0;
    for path in meta_files {
        let source = ParquetSource::open(path)?;
        let metadata = source.metadata();
        rows += candidate_row_groups(metadata, batch_id)
            .into_iter()
            .map(|g| metadata.row_group(g).num_rows() as u64)
            .sum::<u64>();
    }
    Ok(rows)
}

impl BatchMeta {
    /// Puts the rows in pulse order and names the source: the one meta file that held
    /// them, else the first meta file.
    pub fn new(mut rows: Vec<MetaRow>, sources: &[PathBuf], meta_files: &[PathBuf]) -> BatchMeta {
        rows.sort_by_key(|r| (r.first_row, r.last_row, r.event_id));
        let source = match sources {
            [one] => one.clone(),
            _ => meta_files.first().cloned().unwrap_or_default(),
        };
        BatchMeta { source, rows }
    }
}

/// Reads the meta rows of `batch_id` from every meta file, skipping row groups whose
/// statistics exclude it, and sorts them by first row.
pub fn read_batch_meta(meta_files: &[PathBuf], batch_id: i64, labels: bool) -> Result<BatchMeta> {
    let mut rows = Vec::new();
    let mut sources = Vec::new();
    for path in meta_files {
        let groups = candidate_row_groups(ParquetSource::open(path)?.metadata(), batch_id);
        if groups.is_empty() {
            continue;
        }
        let before = rows.len();
        scan_meta_file(
            path,
            labels,
            Some(groups),
            |batch| batch == batch_id,
            |_, _, row| {
                rows.push(row);
                Ok(())
            },
        )?;
        if rows.len() > before {
            sources.push(path.clone());
        }
    }
    Ok(BatchMeta::new(rows, &sources, meta_files))
}

fn bad_value(path: &Path, row: u64, column: &'static str, problem: String) -> Error {
    Error::BadValue {
        path: path.to_path_buf(),
        row,
        column,
        problem,
    }
}

/// Row groups whose `batch_id` statistics may contain `batch_id` (all, without statistics).
fn candidate_row_groups(metadata: &ParquetMetaData, batch_id: i64) -> Vec<usize> {
    let column = metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.name() == BATCH_ID.name);
    (0..metadata.num_row_groups())
        .filter(|&g| {
            let Some(stats) = column.and_then(|c| metadata.row_group(g).column(c).statistics())
            else {
                return true;
            };
            let range = match stats {
                Statistics::Int32(s) => s
                    .min_opt()
                    .zip(s.max_opt())
                    .map(|(a, b)| (*a as i64, *b as i64)),
                Statistics::Int64(s) => s.min_opt().zip(s.max_opt()).map(|(a, b)| (*a, *b)),
                _ => None,
            };
            range.is_none_or(|(min, max)| min <= batch_id && batch_id <= max)
        })
        .collect()
}
