//! The meta table split by batch, once, before the scatter.
//!
//! The Kaggle `train_meta.parquet` is one row group of 132M rows for 660 batch files: read
//! per batch, as each scatter unit needs it, it would be decoded 660 times (about half an
//! hour of CPU). When the batches would decode more than [`RESCAN_LIMIT`](crate::source::meta::RESCAN_LIMIT) times the meta's
//! rows between them, the plan phase reads the meta once, validating every row as
//! [`read_batch_meta`] does, and writes each batch's rows to `.work/meta/batch_N.meta`
//! (fixed 40-byte records, checksummed). Rows of batches that are not being converted are
//! skipped. The directory is written under a temporary name and renamed when complete, so
//! it exists only whole; a scatter unit that finds no split (a job array whose plan phase
//! did not run) reads the meta directly, and one that finds a damaged file does the same.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::work::WorkDir;
use super::Progress;
use crate::error::{IoContext, Result};
use crate::format::checksum::{self, Checksum};
use crate::source::columns::ParquetSource;
use crate::source::meta::{rescans_are_costly, scan_meta_file};
use crate::source::{read_batch_meta, BatchMeta, InputSet, MetaRow};

/// Bytes of one stored row: event id, first row, last row (i64), azimuth, zenith (f64).
const ROW_BYTES: usize = 40;

/// What the split holds for one batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SplitEntry {
    rows: u64,
    xxh3: String,
    /// Indices (into the meta files) of the files that held rows of the batch.
    sources: Vec<usize>,
}

/// The split's index, written last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SplitIndex {
    batches: BTreeMap<i64, SplitEntry>,
}

/// Whether the scatter units would decode the meta more than [`RESCAN_LIMIT`](crate::source::meta::RESCAN_LIMIT) times over
/// if each read its own batch's rows.
pub fn worth_splitting(inputs: &InputSet) -> Result<bool> {
    let ids: Vec<i64> = inputs.batches.iter().map(|b| b.batch_id).collect();
    rescans_are_costly(&inputs.meta, &ids)
}

/// Per-batch buffers of encoded rows, flushed to files when they hold `budget` bytes.
struct Splitter {
    dir: PathBuf,
    buffers: HashMap<i64, Vec<u8>>,
    buffered: usize,
    budget: usize,
    hashes: HashMap<i64, Checksum>,
    index: SplitIndex,
}

impl Splitter {
    fn push(&mut self, batch_id: i64, file: usize, row: MetaRow) -> Result<()> {
        let Some(entry) = self.index.batches.get_mut(&batch_id) else {
            return Ok(()); // filtered out by the scan already
        };
        let mut record = [0u8; ROW_BYTES];
        for (i, v) in [row.event_id, row.first_row, row.last_row]
            .into_iter()
            .enumerate()
        {
            record[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        record[24..32].copy_from_slice(&row.azimuth.to_le_bytes());
        record[32..40].copy_from_slice(&row.zenith.to_le_bytes());
        entry.rows += 1;
        if !entry.sources.contains(&file) {
            entry.sources.push(file);
        }
        self.hashes.entry(batch_id).or_default().update(&record);
        self.buffers
            .entry(batch_id)
            .or_default()
            .extend_from_slice(&record);
        self.buffered += ROW_BYTES;
        if self.buffered >= self.budget {
            self.flush()?;
        }
        Ok(())
    }

    /// Appends every buffer to its batch's file and frees it: a buffer kept with its
    /// capacity would hold memory for a batch whose rows may be over (the Kaggle meta is
    /// sorted by batch), and 660 of them held 5 GB.
    fn flush(&mut self) -> Result<()> {
        for (batch_id, buffer) in self.buffers.drain() {
            let path = self.dir.join(file_name(batch_id));
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .at(&path)?;
            file.write_all(&buffer).at(&path)?;
        }
        self.buffered = 0;
        Ok(())
    }
}

fn file_name(batch_id: i64) -> String {
    format!("batch_{batch_id}.meta")
}

/// Meta rows per unit of progress.
const PROGRESS_ROWS: u64 = 1 << 20;

/// Splits the meta of `inputs` by batch into the work directory, unless already done;
/// `budget` bounds the bytes buffered in memory (their allocations may take twice as
/// much). Reports progress per million (2^20) meta rows read.
pub fn build(
    work: &WorkDir,
    inputs: &InputSet,
    labels: bool,
    budget: usize,
    progress: &dyn Progress,
) -> Result<()> {
    let done = work.meta_split_dir();
    if done.join("index.json").exists() {
        return Ok(());
    }
    let dir = work.root().join(".tmp.meta");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).at(&dir)?;
    }
    std::fs::create_dir_all(&dir).at(&dir)?;
    let mut splitter = Splitter {
        dir: dir.clone(),
        buffers: HashMap::new(),
        buffered: 0,
        budget: budget.max(ROW_BYTES),
        hashes: HashMap::new(),
        index: SplitIndex {
            batches: inputs
                .batches
                .iter()
                .map(|b| {
                    let empty = SplitEntry {
                        rows: 0,
                        xxh3: String::new(),
                        sources: Vec::new(),
                    };
                    (b.batch_id, empty)
                })
                .collect(),
        },
    };
    let wanted: std::collections::HashSet<i64> =
        inputs.batches.iter().map(|b| b.batch_id).collect();
    let sources = inputs
        .meta
        .iter()
        .map(|path| ParquetSource::open(path))
        .collect::<Result<Vec<_>>>()?;
    let total_rows: u64 = sources.iter().map(|s| s.num_rows()).sum();
    progress.begin("split meta", total_rows.div_ceil(PROGRESS_ROWS));
    let rows_read = std::cell::Cell::new(0u64);
    for (file, source) in sources.into_iter().enumerate() {
        scan_meta_file(
            source,
            labels,
            None,
            |batch_id| {
                rows_read.set(rows_read.get() + 1);
                if rows_read.get().is_multiple_of(PROGRESS_ROWS) {
                    progress.advance(0);
                }
                wanted.contains(&batch_id)
            },
            |batch_id, _, row| splitter.push(batch_id, file, row),
        )?;
    }
    splitter.flush()?;
    progress.end();
    let mut index = splitter.index;
    for (batch_id, entry) in &mut index.batches {
        entry.xxh3 = splitter
            .hashes
            .get(batch_id)
            .map_or_else(|| checksum::of_bytes(&[]), |h| h.hex());
        entry.sources.sort_unstable();
    }
    work.write_json(&dir.join("index.json"), &index)?;
    if done.exists() {
        std::fs::remove_dir_all(&done).at(&done)?;
    }
    std::fs::rename(&dir, &done).at(&done)?;
    Ok(())
}

/// The meta rows of `batch_id`: from the split when there is one and its file is intact,
/// else read from the meta files directly.
pub fn batch_meta(
    work: &WorkDir,
    inputs: &InputSet,
    batch_id: i64,
    labels: bool,
) -> Result<BatchMeta> {
    match read_split(work, inputs, batch_id) {
        Ok(Some(meta)) => return Ok(meta),
        Ok(None) => {}
        Err(problem) => tracing::warn!(
            "meta split of batch {batch_id}: {problem}; reading the meta files instead"
        ),
    }
    read_batch_meta(&inputs.meta, batch_id, labels)
}

/// `Ok(None)`: no split (or none for this batch); `Err`: a damaged split.
fn read_split(
    work: &WorkDir,
    inputs: &InputSet,
    batch_id: i64,
) -> std::result::Result<Option<BatchMeta>, String> {
    let index_path = work.meta_split_dir().join("index.json");
    if !index_path.exists() {
        return Ok(None);
    }
    let index: SplitIndex = work.read_json(&index_path).map_err(|e| e.to_string())?;
    let Some(entry) = index.batches.get(&batch_id) else {
        return Ok(None);
    };
    let bytes = if entry.rows == 0 {
        Vec::new()
    } else {
        let path = work.meta_split_dir().join(file_name(batch_id));
        std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?
    };
    if bytes.len() as u64 != entry.rows * ROW_BYTES as u64
        || checksum::of_bytes(&bytes) != entry.xxh3
    {
        return Err("file damaged (size or checksum differs from its index)".into());
    }
    let word = |r: &[u8], i: usize| r[8 * i..8 * i + 8].try_into().expect("8 bytes");
    let rows = bytes
        .chunks_exact(ROW_BYTES)
        .map(|r| MetaRow {
            event_id: i64::from_le_bytes(word(r, 0)),
            first_row: i64::from_le_bytes(word(r, 1)),
            last_row: i64::from_le_bytes(word(r, 2)),
            azimuth: f64::from_le_bytes(word(r, 3)),
            zenith: f64::from_le_bytes(word(r, 4)),
        })
        .collect();
    let sources: Vec<PathBuf> = entry
        .sources
        .iter()
        .filter_map(|&i| inputs.meta.get(i).cloned())
        .collect();
    Ok(Some(BatchMeta::new(rows, &sources, &inputs.meta)))
}
