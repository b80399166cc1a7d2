//! The meta table: for each event, its batch, its inclusive row range in that batch
//! file, and (train split only) its labels.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;

use super::columns::{ColumnSpec, Kind, ParquetSource, EVENT_ID};
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

/// Reads the rows of a meta file (only row groups `groups`, all when `None`) and hands each
/// row of a `wanted` batch to `row` with its batch id and row number, after validating it;
/// stops at the first invalid one with an error naming the file, row and column. Rows of
/// other batches are neither validated nor passed on.
pub fn scan_meta_file(
    source: ParquetSource,
    labels: bool,
    groups: Option<Vec<usize>>,
    wanted: impl Fn(i64) -> bool,
    mut row: impl FnMut(i64, u64, MetaRow) -> Result<()>,
) -> Result<()> {
    let mut specs = vec![BATCH_ID, EVENT_ID, FIRST, LAST];
    if labels {
        specs.extend([AZIMUTH, ZENITH]);
    }
    // `read` consumes the source; errors still name its file.
    let path = source.path().to_path_buf();
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
                            &path,
                            at,
                            name,
                            format!("label {v} of event {} is not finite", event[i]),
                        ));
                    }
                }
            }
            if first[i] < 0 || last[i] < first[i] {
                return Err(bad_value(
                    &path,
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

/// Reading the meta per batch may decode up to this many times its rows before a single
/// pass over it is preferred.
pub const RESCAN_LIMIT: u64 = 2;

/// Whether reading the meta once per batch of `batch_ids` would decode more than
/// [`RESCAN_LIMIT`] times its rows (one meta file shared by many batches, without
/// row-group statistics that pick each batch out, as in the Kaggle originals).
pub fn rescans_are_costly(meta_files: &[PathBuf], batch_ids: &[i64]) -> Result<bool> {
    if batch_ids.len() < 2 {
        return Ok(false);
    }
    let (mut total, mut scanned) = (0, 0);
    for path in meta_files {
        let source = ParquetSource::open(path)?;
        let metadata = source.metadata();
        total += source.num_rows();
        for &batch_id in batch_ids {
            // What `read_batch_meta` decodes of this file for that batch.
            scanned += candidate_row_groups(metadata, batch_id)
                .into_iter()
                .map(|g| metadata.row_group(g).num_rows() as u64)
                .sum::<u64>();
        }
    }
    Ok(scanned > RESCAN_LIMIT * total.max(1))
}

/// The meta of many batches, read in whichever way decodes less: per batch on demand when
/// that is cheap, else every wanted row in one pass (held in memory until taken).
pub struct MetaByBatch {
    files: Vec<PathBuf>,
    labels: bool,
    loaded: Option<HashMap<i64, BatchMeta>>,
}

impl MetaByBatch {
    /// Prepares to hand out the meta of `batch_ids`.
    pub fn new(meta_files: &[PathBuf], batch_ids: &[i64], labels: bool) -> Result<MetaByBatch> {
        let loaded = if rescans_are_costly(meta_files, batch_ids)? {
            let wanted: HashSet<i64> = batch_ids.iter().copied().collect();
            let mut rows: HashMap<i64, (Vec<MetaRow>, Vec<PathBuf>)> = HashMap::new();
            for path in meta_files {
                scan_meta_file(
                    ParquetSource::open(path)?,
                    labels,
                    None,
                    |b| wanted.contains(&b),
                    |b, _, row| {
                        let (list, sources) = rows.entry(b).or_default();
                        list.push(row);
                        if sources.last() != Some(path) {
                            sources.push(path.clone());
                        }
                        Ok(())
                    },
                )?;
            }
            Some(
                rows.into_iter()
                    .map(|(b, (list, sources))| (b, BatchMeta::new(list, &sources, meta_files)))
                    .collect(),
            )
        } else {
            None
        };
        Ok(MetaByBatch {
            files: meta_files.to_vec(),
            labels,
            loaded,
        })
    }

    /// The meta of `batch_id` (empty when the meta has no row of it).
    pub fn take(&mut self, batch_id: i64) -> Result<BatchMeta> {
        match &mut self.loaded {
            Some(loaded) => Ok(loaded
                .remove(&batch_id)
                .unwrap_or_else(|| BatchMeta::new(Vec::new(), &[], &self.files))),
            None => read_batch_meta(&self.files, batch_id, self.labels),
        }
    }
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
        let source = ParquetSource::open(path)?;
        let groups = candidate_row_groups(source.metadata(), batch_id);
        if groups.is_empty() {
            continue;
        }
        let before = rows.len();
        scan_meta_file(
            source,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{write_dataset, SynthOptions};

    #[test]
    fn meta_by_batch_reads_the_same_rows_either_way() {
        let dir = tempfile::tempdir().unwrap();
        for (name, row_group_rows, costly) in [("shared", None, true), ("grouped", Some(50), false)]
        {
            let root = dir.path().join(name);
            write_dataset(
                &root,
                &SynthOptions {
                    events: 150,
                    files: 3,
                    row_group_rows,
                    ..SynthOptions::default()
                },
            )
            .unwrap();
            let meta = vec![root.join("train_meta.parquet")];
            let ids = [1, 2, 3, 99];
            assert_eq!(rescans_are_costly(&meta, &ids).unwrap(), costly, "{name}");
            let mut by_batch = MetaByBatch::new(&meta, &ids, true).unwrap();
            assert_eq!(by_batch.loaded.is_some(), costly);
            for id in ids {
                let direct = read_batch_meta(&meta, id, true).unwrap();
                let taken = by_batch.take(id).unwrap();
                assert_eq!(taken.rows, direct.rows, "{name}: batch {id}");
                assert_eq!(taken.source, direct.source);
                assert_eq!(taken.rows.is_empty(), id == 99);
            }
        }
    }
}
