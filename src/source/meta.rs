//! The meta table: for each event, its batch, its inclusive row range in that batch
//! file, and (train split only) its labels.

use std::collections::HashMap;
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

/// Bytes of meta rows [`MetaByBatch`] holds at once when it reads the meta in passes
/// (beyond them, one batch's rows): 512 MiB, 7-13M rows of the Kaggle meta's 132M (the
/// rows' vectors grow by doubling), so 10-20 passes over it. Held whole, its rows took
/// about 5 GB (770 MiB for 20M rows).
pub const META_PASS_BYTES: usize = 512 << 20;

/// The meta of many batches, read in whichever way decodes less: per batch on demand when
/// that is cheap, else in passes over the whole meta, each holding the rows of the next
/// batches to be taken (in the order given) within [`META_PASS_BYTES`].
pub struct MetaByBatch {
    files: Vec<PathBuf>,
    labels: bool,
    passes: Option<Passes>,
}

/// The pass mode of [`MetaByBatch`].
struct Passes {
    /// Each wanted batch's place in the order given.
    place: HashMap<i64, usize>,
    /// The batches read by the last pass and not yet taken (empty ones included).
    loaded: HashMap<i64, BatchMeta>,
    /// Bytes of rows one pass may hold (its first batch's are always held).
    budget: usize,
    /// Passes made, and the most row bytes one held (for tests).
    count: usize,
    peak: usize,
}

impl MetaByBatch {
    /// Prepares to hand out the meta of `batch_ids` (best taken in that order: each pass
    /// reads the batches after the one asked for).
    pub fn new(meta_files: &[PathBuf], batch_ids: &[i64], labels: bool) -> Result<MetaByBatch> {
        Self::within(meta_files, batch_ids, labels, META_PASS_BYTES)
    }

    fn within(
        meta_files: &[PathBuf],
        batch_ids: &[i64],
        labels: bool,
        budget: usize,
    ) -> Result<MetaByBatch> {
        let passes = rescans_are_costly(meta_files, batch_ids)?.then(|| {
            let mut place = HashMap::new();
            for (i, &b) in batch_ids.iter().enumerate() {
                place.entry(b).or_insert(i);
            }
            Passes {
                place,
                loaded: HashMap::new(),
                budget,
                count: 0,
                peak: 0,
            }
        });
        Ok(MetaByBatch {
            files: meta_files.to_vec(),
            labels,
            passes,
        })
    }

    /// The meta of `batch_id` (empty when the meta has no row of it).
    pub fn take(&mut self, batch_id: i64) -> Result<BatchMeta> {
        let Some(passes) = &mut self.passes else {
            return read_batch_meta(&self.files, batch_id, self.labels);
        };
        if let Some(meta) = passes.loaded.remove(&batch_id) {
            return Ok(meta);
        }
        let Some(&first) = passes.place.get(&batch_id) else {
            return read_batch_meta(&self.files, batch_id, self.labels);
        };
        passes.loaded = passes.read_from(first, &self.files, self.labels)?;
        Ok(passes
            .loaded
            .remove(&batch_id)
            .unwrap_or_else(|| BatchMeta::new(Vec::new(), &[], &self.files)))
    }
}

impl Passes {
    /// One pass over the meta: the rows of the wanted batches placed from `first` on, as
    /// many as fit the budget. Rows are collected for every batch from `first` on; while
    /// they hold more than the budget, the batch placed last among those held is let go,
    /// and the pass ends before it. Every batch from `first` up to there is in the
    /// result, those without rows empty.
    fn read_from(
        &mut self,
        first: usize,
        files: &[PathBuf],
        labels: bool,
    ) -> Result<HashMap<i64, BatchMeta>> {
        let end = std::cell::Cell::new(usize::MAX);
        let takes = |b: i64| {
            self.place
                .get(&b)
                .is_some_and(|&p| p >= first && p < end.get())
        };
        let mut rows: HashMap<i64, (Vec<MetaRow>, Vec<PathBuf>)> = HashMap::new();
        let mut held = 0usize;
        let mut peak = 0usize;
        for path in files {
            scan_meta_file(
                ParquetSource::open(path)?,
                labels,
                None,
                takes,
                |b, _, row| {
                    let (list, sources) = rows.entry(b).or_default();
                    let before = list.capacity();
                    list.push(row);
                    held += (list.capacity() - before) * std::mem::size_of::<MetaRow>();
                    if sources.last() != Some(path) {
                        sources.push(path.clone());
                    }
                    peak = peak.max(held);
                    while held > self.budget {
                        let last = rows
                            .keys()
                            .map(|b| (self.place[b], *b))
                            .filter(|&(p, _)| p > first)
                            .max();
                        let Some((p, b)) = last else { break };
                        let (list, _) = rows.remove(&b).unwrap_or_default();
                        held -= list.capacity() * std::mem::size_of::<MetaRow>();
                        end.set(p);
                    }
                    Ok(())
                },
            )?;
        }
        self.count += 1;
        self.peak = self.peak.max(peak);
        let mut loaded: HashMap<i64, BatchMeta> = rows
            .into_iter()
            .map(|(b, (list, sources))| (b, BatchMeta::new(list, &sources, files)))
            .collect();
        for (&b, &p) in &self.place {
            if p >= first && p < end.get() {
                loaded
                    .entry(b)
                    .or_insert_with(|| BatchMeta::new(Vec::new(), &[], files));
            }
        }
        Ok(loaded)
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
            assert_eq!(by_batch.passes.is_some(), costly);
            for id in ids {
                let direct = read_batch_meta(&meta, id, true).unwrap();
                let taken = by_batch.take(id).unwrap();
                assert_eq!(taken.rows, direct.rows, "{name}: batch {id}");
                assert_eq!(taken.source, direct.source);
                assert_eq!(taken.rows.is_empty(), id == 99);
            }
        }
    }

    #[test]
    fn meta_read_in_passes_holds_at_most_its_budget_and_gives_every_batch_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        // One meta file, one row group, six batches of 100 events (a Vec of 100 rows
        // holds 128: 5,120 bytes): a budget of two batches.
        write_dataset(
            dir.path(),
            &SynthOptions {
                events: 600,
                files: 6,
                ..SynthOptions::default()
            },
        )
        .unwrap();
        let meta = vec![dir.path().join("train_meta.parquet")];
        let batch_bytes = 128 * std::mem::size_of::<MetaRow>();
        let budget = 2 * batch_bytes;
        let ids = [1, 2, 3, 99, 4, 5, 6];
        for (order, passes) in [(ids.to_vec(), 3), (ids.iter().rev().copied().collect(), 7)] {
            let mut by_batch = MetaByBatch::within(&meta, &ids, true, budget).unwrap();
            for &id in &order {
                let direct = read_batch_meta(&meta, id, true).unwrap();
                let taken = by_batch.take(id).unwrap();
                assert_eq!(taken.rows, direct.rows, "batch {id}");
                assert_eq!(taken.source, direct.source, "batch {id}");
                assert_eq!(taken.rows.len(), if id == 99 { 0 } else { 100 });
            }
            let held = by_batch.passes.as_ref().unwrap();
            // In order: batches 1-2, 3-99-4 (99 has no rows), 5-6. Backwards, each pass
            // starts at the batch asked for and reads those placed after it, already
            // taken: a pass for each.
            assert_eq!(held.count, passes, "passes taking {order:?}");
            assert!(
                held.peak <= budget + batch_bytes,
                "held {} bytes of rows, budget {budget}",
                held.peak
            );
            assert!(
                held.peak > batch_bytes,
                "the budget was used: {}",
                held.peak
            );
        }
    }
}
