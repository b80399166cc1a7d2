//! A bucket's chunks across every spill file, read for it alone from the spill files'
//! [chunk tables](super::chunk_table) when its gather unit starts: the gather holds no
//! list of every chunk.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Mutex;

use super::chunk_table::{entries_at, ChunkTable};
use super::spill::{SpillChunk, SpillIndex};
use super::work::WorkDir;
use crate::error::{IoContext, Result};

/// Every batch's spill index, and its spill file and chunk table, opened once for the
/// gather phase where the open-files limit allows (the rest are opened at each use).
pub struct SpillFiles {
    work: WorkDir,
    indexes: Vec<SpillIndex>,
    held: Vec<Option<BatchFiles>>,
}

/// A batch's spill file and chunk table, open, with the table's last block of bucket
/// starts read.
struct BatchFiles {
    spill: File,
    table: File,
    starts: Mutex<StartsBlock>,
}

/// The starts of buckets `first..first + starts.len()` of a chunk table.
#[derive(Default)]
struct StartsBlock {
    first: u64,
    starts: Vec<u64>,
}

/// Buckets whose starts a held table reads at once: units run in bucket order, so the
/// threads' buckets lie close together and one read serves the next thousand or so.
/// Read a bucket at a time, the starts took a read a bucket and batch: over 100k events
/// in 100 files with 16 KiB shards, 1.40M reads in the gather, 193k since.
const STARTS_AT_ONCE: u64 = 1024;

/// Open files a process keeps for everything but the held spill files (its standard
/// streams, the shards being written, the files of the thread pool and the allocator).
const FILES_KEPT_FREE: u64 = 256;

impl SpillFiles {
    /// Opens the spill files and chunk tables of `indexes` (in batch order) in `work`,
    /// raising this process's open-files limit to its hard limit first: as many batches'
    /// as leave 256 files free are held open.
    pub fn open(work: &WorkDir, indexes: Vec<SpillIndex>) -> Result<Self> {
        let holdable = raise_open_files_limit().saturating_sub(FILES_KEPT_FREE) / 2;
        Self::open_holding(work, indexes, holdable)
    }

    /// [`SpillFiles::open`], holding the files of the first `holdable` batches.
    fn open_holding(work: &WorkDir, indexes: Vec<SpillIndex>, holdable: u64) -> Result<Self> {
        let mut held = Vec::with_capacity(indexes.len());
        for (at, index) in indexes.iter().enumerate() {
            held.push(if (at as u64) < holdable {
                Some(open_batch(work, index.batch_id)?)
            } else {
                None
            });
        }
        Ok(SpillFiles {
            work: work.clone(),
            indexes,
            held,
        })
    }

    /// The work directory the files are in.
    pub fn work(&self) -> &WorkDir {
        &self.work
    }

    /// The indexes, in batch order.
    pub fn indexes(&self) -> &[SpillIndex] {
        &self.indexes
    }

    /// Whether every batch's files are held open.
    pub fn all_held(&self) -> bool {
        self.held.iter().all(Option::is_some)
    }

    /// The chunks of `bucket` in every spill file, read from their chunk tables.
    pub fn chunks_of(&self, bucket: u64) -> Result<BucketChunks> {
        let mut found = BucketChunks::default();
        for (at, index) in self.indexes.iter().enumerate() {
            let start = found.chunks.len();
            let path = self.work.chunk_table(index.batch_id);
            let (table, out) = (&index.table, &mut found.chunks);
            match &self.held[at] {
                Some(files) => {
                    let range = files.bucket_range(&path, table, bucket)?;
                    table.read_entries(&path, &files.table, bucket, range, out)?;
                }
                None => {
                    let file = File::open(&path).at(&path)?;
                    table.read_bucket(&path, &file, bucket, out)?;
                }
            }
            if found.chunks.len() > start {
                found.runs.push((at, start..found.chunks.len()));
            }
        }
        Ok(found)
    }

    /// Calls `read` with the spill file of the batch at position `at` (in batch order)
    /// and its path.
    pub fn with_spill<T>(
        &self,
        at: usize,
        read: impl FnOnce(&Path, &File) -> Result<T>,
    ) -> Result<T> {
        let path = self.work.spill_file(self.indexes[at].batch_id);
        match &self.held[at] {
            Some(files) => read(&path, &files.spill),
            None => read(&path, &File::open(&path).at(&path)?),
        }
    }
}

fn open_batch(work: &WorkDir, batch_id: i64) -> Result<BatchFiles> {
    let open = |path: std::path::PathBuf| File::open(&path).at(&path);
    Ok(BatchFiles {
        spill: open(work.spill_file(batch_id))?,
        table: open(work.chunk_table(batch_id))?,
        starts: Mutex::default(),
    })
}

impl BatchFiles {
    /// The entries of `bucket` in `table` (this batch's table, at `path`): its start and
    /// the next bucket's, from the block of starts read last, or a block read now.
    fn bucket_range(&self, path: &Path, table: &ChunkTable, bucket: u64) -> Result<[u64; 2]> {
        let mut block = self.starts.lock().expect("starts lock");
        let held = block.first..block.first + block.starts.len() as u64;
        if !(held.contains(&bucket) && held.contains(&(bucket + 1))) {
            let first = bucket - bucket % STARTS_AT_ONCE;
            table.read_starts(
                path,
                &self.table,
                first,
                STARTS_AT_ONCE + 1,
                &mut block.starts,
            )?;
            block.first = first;
        }
        Ok(entries_at(&block.starts, (bucket - block.first) as usize))
    }
}

/// Raises the soft limit on open files to the hard limit (most systems start processes
/// at 1,024 and allow far more); returns the soft limit then in force.
fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; the call only reads it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    limit.rlim_cur
}

/// One bucket's chunks: for each spill file holding some (by its position in batch
/// order), the range of `chunks` that are its, in file order.
#[derive(Debug, Default)]
pub struct BucketChunks {
    runs: Vec<(usize, Range<usize>)>,
    chunks: Vec<SpillChunk>,
}

impl BucketChunks {
    /// Each spill file holding chunks of the bucket (its position in batch order), in batch
    /// order, with those chunks in file order.
    pub fn by_batch(&self) -> impl Iterator<Item = (usize, &[SpillChunk])> {
        self.runs
            .iter()
            .map(|(at, range)| (*at, &self.chunks[range.clone()]))
    }

    /// What the chunks hold, in all.
    pub fn totals(&self) -> BucketTotals {
        self.chunks
            .iter()
            .fold(BucketTotals::default(), |totals, c| BucketTotals {
                events: totals.events + c.events,
                pulses: totals.pulses + c.pulses,
                largest_chunk: totals.largest_chunk.max(c.len),
            })
    }
}

/// Events and pulses of one bucket across every spill file, and its largest chunk in
/// bytes (the most read at once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketTotals {
    /// Events.
    pub events: u64,
    /// Pulses.
    pub pulses: u64,
    /// Bytes of the largest chunk.
    pub largest_chunk: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::chunk_table::ChunkTable;
    use crate::convert::spill::{BucketEvents, SpillWriter};
    use crate::event::{EventHeader, RawEvent, ValueRange};
    use crate::rng::Rng;

    const BUCKETS: u64 = 7;

    /// Batch `batch_id`'s spill file and chunk table in `work`: `events` events of 1-4
    /// pulses (event id `10_000 * batch_id + i`) in pseudo-random buckets (none in bucket 5),
    /// through buffers small enough to flush many chunks.
    fn spill_batch(work: &WorkDir, batch_id: i64, events: u64) -> SpillIndex {
        spill_batch_over(work, batch_id, events, BUCKETS, &[0, 1, 2, 3, 4, 6])
    }

    /// [`spill_batch`] over `buckets` buckets, its events in buckets drawn from `used`.
    fn spill_batch_over(
        work: &WorkDir,
        batch_id: i64,
        events: u64,
        buckets: u64,
        used: &[usize],
    ) -> SpillIndex {
        let mut rng = Rng::new(batch_id as u64);
        let mut file = File::create(work.spill_file(batch_id)).unwrap();
        let mut writer = SpillWriter::new(&mut file, 16 << 10);
        let mut pulses = 0;
        for i in 0..events {
            let n = 1 + rng.next_u64() as usize % 4;
            let event = RawEvent {
                header: Some(EventHeader {
                    event_id: 10_000 * batch_id + i as i64,
                    batch_id,
                    first_row: i,
                    azimuth: 0.5,
                    zenith: 1.5,
                }),
                sensor_id: vec![3; n],
                time: vec![i as i64; n],
                charge: vec![1.0; n],
                auxiliary: vec![0; n],
            };
            let bucket = used[rng.next_u64() as usize % used.len()];
            writer.push(bucket, i, &event).unwrap();
            pulses += n as u64;
        }
        let (mut chunks, spill_bytes) = writer.finish().unwrap();
        let (table, bytes) = ChunkTable::encode(&mut chunks, buckets, spill_bytes);
        std::fs::write(work.chunk_table(batch_id), bytes).unwrap();
        SpillIndex {
            batch_id,
            events,
            pulses,
            spill_bytes,
            range: ValueRange::default(),
            table,
        }
    }

    #[test]
    fn each_bucket_gathers_every_event_of_it_whether_its_files_are_held_or_opened() {
        let dir = tempfile::tempdir().unwrap();
        let work = WorkDir::new(dir.path());
        work.prepare().unwrap();
        // Batch 8 has no events at all.
        let indexes: Vec<SpillIndex> = [(3, 5000), (1, 3000), (8, 0), (2, 4000)]
            .into_iter()
            .map(|(batch, events)| spill_batch(&work, batch, events))
            .collect();
        for holdable in [0, 1, 4] {
            let files = SpillFiles::open_holding(&work, indexes.clone(), holdable).unwrap();
            assert_eq!(files.all_held(), holdable == 4);
            let mut ids = Vec::new();
            for bucket in 0..BUCKETS {
                let chunks = files.chunks_of(bucket).unwrap();
                let batches: Vec<usize> = chunks.by_batch().map(|(at, _)| at).collect();
                let expected: &[usize] = if bucket == 5 { &[] } else { &[0, 1, 3] };
                assert_eq!(batches, expected, "bucket {bucket}");
                let mut events = BucketEvents::default();
                for (at, run) in chunks.by_batch() {
                    assert!(run.windows(2).all(|w| w[0].offset < w[1].offset));
                    files
                        .with_spill(at, |path, file| {
                            run.iter()
                                .try_for_each(|c| events.read_chunk(path, file, c, &mut Vec::new()))
                        })
                        .unwrap();
                }
                let totals = chunks.totals();
                assert_eq!(
                    totals.events,
                    events.records.len() as u64,
                    "bucket {bucket}"
                );
                assert_eq!(totals.pulses, events.pulses.len() as u64, "bucket {bucket}");
                ids.extend(events.records.iter().map(|(_, h, _)| h.event_id));
            }
            ids.sort_unstable();
            let mut expected: Vec<i64> = [(3, 5000), (1, 3000), (2, 4000)]
                .into_iter()
                .flat_map(|(batch, events)| (0..events).map(move |i| 10_000 * batch + i))
                .collect();
            expected.sort_unstable();
            assert_eq!(ids.len(), 12_000, "holding {holdable}");
            assert_eq!(ids, expected, "holding {holdable}");
        }
    }

    #[test]
    fn buckets_in_any_order_read_their_chunks_across_blocks_of_starts() {
        let dir = tempfile::tempdir().unwrap();
        let work = WorkDir::new(dir.path());
        work.prepare().unwrap();
        // Three blocks of starts and a bit; every other bucket holds events.
        let buckets = 3 * STARTS_AT_ONCE + 7;
        let used: Vec<usize> = (0..buckets as usize).step_by(2).collect();
        let indexes: Vec<SpillIndex> = [(1, 6000), (2, 3000)]
            .into_iter()
            .map(|(batch, events)| spill_batch_over(&work, batch, events, buckets, &used))
            .collect();
        let held = SpillFiles::open_holding(&work, indexes.clone(), 2).unwrap();
        let opened = SpillFiles::open_holding(&work, indexes, 0).unwrap();
        // Forward, backward, and to and fro across the blocks' edges.
        let mut order: Vec<u64> = (0..buckets).chain((0..buckets).rev()).collect();
        order.extend([1023, 1024, 1023, 2048, 0, 3078, 3077, 1025]);
        let mut events = 0;
        for &bucket in &order {
            let (a, b) = (
                held.chunks_of(bucket).unwrap(),
                opened.chunks_of(bucket).unwrap(),
            );
            assert_eq!(a.runs, b.runs, "bucket {bucket}");
            assert_eq!(a.chunks, b.chunks, "bucket {bucket}");
            assert!(a.chunks.iter().all(|c| c.bucket == bucket));
            assert!(bucket % 2 == 0 || a.chunks.is_empty(), "bucket {bucket}");
            events += a.totals().events;
        }
        // Each bucket twice, and eight of them once more.
        let again: u64 = [1023, 1024, 1023, 2048, 0, 3078, 3077, 1025]
            .map(|b| held.chunks_of(b).unwrap().totals().events)
            .iter()
            .sum();
        assert_eq!(events, 2 * 9000 + again);
        let error = held.chunks_of(buckets).unwrap_err().to_string();
        assert!(
            error.contains(&format!("bucket {buckets} is past")),
            "{error}"
        );
    }
}
