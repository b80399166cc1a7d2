//! The chunk table of a spill file (`batch_N.chunks` beside it): its chunks sorted by
//! bucket, with where each bucket's entries start, so that the gather reads one bucket's
//! entries with two reads of each table instead of holding every spill file's chunk list
//! through its phase: a scatter unit writes a chunk per bucket each time its buffer fills,
//! so a large input under a small limit makes millions (48 bytes each in memory).
//!
//! Layout (little-endian): `buckets + 1` u64 starts (the entry number of each bucket's
//! first chunk; the last is the entry count), then an entry per chunk, sorted by bucket then
//! offset, of [`ENTRY_BYTES`]: offset, length, events, pulses and XXH3-64 (u64 each). It is
//! written durably before the spill index, which records its size and checksum.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::spill::{damaged, SpillChunk, MIN_PULSE_BYTES, RECORD_HEADER_BYTES};
use crate::error::{IoContext, Result};
use crate::format::checksum::{self, Checksum};
use crate::format::pod::{as_bytes, as_bytes_mut};

/// Words (u64) of a chunk's entry.
const ENTRY_WORDS: u64 = 5;

/// Bytes of a chunk's entry.
pub const ENTRY_BYTES: u64 = 8 * ENTRY_WORDS;

/// What a chunk table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkTable {
    /// Buckets of the plan.
    pub buckets: u64,
    /// Chunks listed.
    pub chunks: u64,
    /// Bytes of the spill file's chunks, which every entry lies within.
    pub spill_bytes: u64,
    /// XXH3-64 of the table's bytes (16 hex digits in the index file).
    #[serde(with = "checksum::hex_u64")]
    pub xxh3: u64,
}

/// Entries read from a table at once when reading all of it.
const ENTRIES_AT_ONCE: u64 = 4096;

impl ChunkTable {
    /// Sorts `chunks` by bucket then offset and encodes them as the table of a spill file
    /// of `spill_bytes`; every chunk's bucket is below `buckets`.
    pub fn encode(
        chunks: &mut [SpillChunk],
        buckets: u64,
        spill_bytes: u64,
    ) -> (ChunkTable, Vec<u8>) {
        chunks.sort_unstable_by_key(|c| (c.bucket, c.offset));
        let mut starts = Vec::with_capacity(buckets as usize + 1);
        let mut next = 0;
        for bucket in 0..=buckets {
            next += chunks[next..].partition_point(|c| c.bucket < bucket);
            starts.push(next as u64);
        }
        debug_assert_eq!(
            next,
            chunks.len(),
            "every chunk's bucket is below the count"
        );
        let mut bytes = Vec::with_capacity(8 * starts.len() + ENTRY_BYTES as usize * chunks.len());
        bytes.extend_from_slice(as_bytes(&starts));
        for c in chunks.iter() {
            bytes.extend_from_slice(as_bytes(&[c.offset, c.len, c.events, c.pulses, c.xxh3]));
        }
        let table = ChunkTable {
            buckets,
            chunks: chunks.len() as u64,
            spill_bytes,
            xxh3: checksum::value_of_bytes(&bytes),
        };
        (table, bytes)
    }

    /// Bytes of the table's file.
    pub fn bytes(&self) -> u64 {
        self.entry_offset(self.chunks)
    }

    fn entry_offset(&self, entry: u64) -> u64 {
        8 * (self.buckets + 1) + ENTRY_BYTES * entry
    }

    /// Appends `bucket`'s chunks, in file order, to `out`, from the table `file` at `path`.
    pub fn read_bucket(
        &self,
        path: &Path,
        file: &File,
        bucket: u64,
        out: &mut Vec<SpillChunk>,
    ) -> Result<()> {
        let mut pair = Vec::with_capacity(2);
        self.read_starts(path, file, bucket, 2, &mut pair)?;
        self.read_entries(path, file, bucket, entries_at(&pair, 0), out)
    }

    /// Replaces `starts` with the starts of buckets `first..first + count`, as many of them
    /// as the table holds (bucket `buckets`'s start is the entry count).
    pub fn read_starts(
        &self,
        path: &Path,
        file: &File,
        first: u64,
        count: u64,
        starts: &mut Vec<u64>,
    ) -> Result<()> {
        let held = count.min((self.buckets + 1).saturating_sub(first));
        starts.clear();
        starts.resize(held as usize, 0);
        read_u64s(path, file, 8 * first, starts)
    }

    /// Appends the chunks of `bucket`, its entries `range` (from its start and the next
    /// bucket's), to `out`.
    pub fn read_entries(
        &self,
        path: &Path,
        file: &File,
        bucket: u64,
        [start, end]: [u64; 2],
        out: &mut Vec<SpillChunk>,
    ) -> Result<()> {
        if bucket >= self.buckets {
            return Err(damaged(
                path,
                format!("bucket {bucket} is past its {} buckets", self.buckets),
            ));
        }
        if start > end || end > self.chunks {
            return Err(damaged(
                path,
                format!(
                    "it puts bucket {bucket} at entries {start}..{end} of {}",
                    self.chunks
                ),
            ));
        }
        let mut words = vec![0u64; ((end - start) * ENTRY_WORDS) as usize];
        read_u64s(path, file, self.entry_offset(start), &mut words)?;
        for entry in words.chunks_exact(ENTRY_WORDS as usize) {
            out.push(self.decode(path, entry, bucket)?);
        }
        Ok(())
    }

    /// The chunk `entry` describes, checked to lie within the spill file and to hold no
    /// more events and pulses than its bytes can (a damaged entry must not ask for more
    /// memory than the spill file holds).
    fn decode(&self, path: &Path, entry: &[u64], bucket: u64) -> Result<SpillChunk> {
        let &[offset, len, events, pulses, xxh3] = entry else {
            unreachable!("an entry is {ENTRY_WORDS} words")
        };
        let chunk = SpillChunk {
            bucket,
            offset,
            len,
            events,
            pulses,
            xxh3,
        };
        let within = chunk
            .offset
            .checked_add(chunk.len)
            .is_some_and(|end| end <= self.spill_bytes);
        let fits = chunk.events.saturating_mul(RECORD_HEADER_BYTES)
            + chunk.pulses.saturating_mul(MIN_PULSE_BYTES)
            <= chunk.len;
        if within && fits {
            Ok(chunk)
        } else {
            Err(damaged(
                path,
                format!(
                    "its entry for a chunk of bucket {bucket} ({} bytes at offset {}, {} events, \
                     {} pulses) does not fit the {} bytes of the spill file",
                    chunk.len, chunk.offset, chunk.events, chunk.pulses, self.spill_bytes
                ),
            ))
        }
    }

    /// Checks the table's checksum and order, and calls `each` with every chunk, by
    /// bucket then offset; reads the starts whole (8 bytes a bucket) and the entries
    /// 4,096 at a time. A damaged table is an error once `each` has seen
    /// what it held: for checks of the chunks, whose own checksums catch a damaged entry.
    pub fn check_each(
        &self,
        path: &Path,
        file: &File,
        mut each: impl FnMut(&SpillChunk) -> Result<()>,
    ) -> Result<()> {
        let found = std::fs::metadata(path).at(path)?.len();
        if found != self.bytes() {
            return Err(damaged(
                path,
                format!("is {found} bytes, its index says {}", self.bytes()),
            ));
        }
        let mut hasher = Checksum::new();
        let mut starts = Vec::new();
        self.read_starts(path, file, 0, self.buckets + 1, &mut starts)?;
        hasher.update(as_bytes(&starts));
        let ordered = starts.first() == Some(&0)
            && starts.last() == Some(&self.chunks)
            && starts.windows(2).all(|w| w[0] <= w[1]);
        if !ordered {
            return Err(damaged(path, "its bucket starts are out of order".into()));
        }
        let (mut bucket, mut read) = (0, 0);
        let mut words = Vec::new();
        while read < self.chunks {
            let count = (self.chunks - read).min(ENTRIES_AT_ONCE);
            words.resize((count * ENTRY_WORDS) as usize, 0);
            read_u64s(path, file, self.entry_offset(read), &mut words)?;
            hasher.update(as_bytes(&words));
            for entry in words.chunks_exact(ENTRY_WORDS as usize) {
                while starts[bucket + 1] <= read {
                    bucket += 1;
                }
                each(&self.decode(path, entry, bucket as u64)?)?;
                read += 1;
            }
        }
        if hasher.value() != self.xxh3 {
            return Err(damaged(
                path,
                format!(
                    "has checksum {}, its index says {}",
                    checksum::hex(hasher.value()),
                    checksum::hex(self.xxh3)
                ),
            ));
        }
        Ok(())
    }
}

/// The entries of the bucket whose start is `starts[at]`: from it to the next bucket's
/// start. Past the table, none (and [`ChunkTable::read_entries`] names the bucket).
pub fn entries_at(starts: &[u64], at: usize) -> [u64; 2] {
    match starts.get(at..at + 2) {
        Some(&[start, end]) => [start, end],
        _ => [0, 0],
    }
}

/// Reads `values.len()` u64 from `file` at `offset` (written by [`as_bytes`]).
fn read_u64s(path: &Path, file: &File, offset: u64, values: &mut [u64]) -> Result<()> {
    file.read_exact_at(as_bytes_mut(values), offset).at(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::checksum;

    /// Chunks of `buckets`, in that (file) order, each a record's worth of bytes per event
    /// and pulse at its position's offset.
    fn chunks_of(buckets: &[u64]) -> Vec<SpillChunk> {
        let mut offset = 0;
        buckets
            .iter()
            .enumerate()
            .map(|(at, &bucket)| {
                let (events, pulses) = (1 + at as u64 % 3, 5 + at as u64);
                let len = events * RECORD_HEADER_BYTES + pulses * MIN_PULSE_BYTES + at as u64;
                let chunk = SpillChunk {
                    bucket,
                    offset,
                    len,
                    events,
                    pulses,
                    xxh3: checksum::value_of_bytes(&at.to_le_bytes()),
                };
                offset += len;
                chunk
            })
            .collect()
    }

    fn written(chunks: &[SpillChunk], buckets: u64) -> (ChunkTable, tempfile::NamedTempFile) {
        let spill_bytes = chunks.iter().map(|c| c.offset + c.len).max().unwrap_or(0);
        let (table, bytes) = ChunkTable::encode(&mut chunks.to_vec(), buckets, spill_bytes);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), bytes).unwrap();
        (table, file)
    }

    #[test]
    fn a_buckets_chunks_are_those_a_scan_finds_in_file_order() {
        // Flushes interleave the buckets: ascending runs, repeats, gaps (bucket 4 is
        // nowhere, 0 only first, 9 only last).
        let chunks = chunks_of(&[0, 1, 2, 5, 1, 2, 3, 6, 2, 1, 3, 2, 2, 5, 1, 9, 9]);
        let (table, file) = written(&chunks, 11);
        assert_eq!(table.chunks, chunks.len() as u64);
        assert_eq!(std::fs::metadata(file.path()).unwrap().len(), table.bytes());
        for bucket in 0..11 {
            let scanned: Vec<SpillChunk> = chunks
                .iter()
                .filter(|c| c.bucket == bucket)
                .cloned()
                .collect();
            let mut found = vec![chunks[0].clone()];
            table
                .read_bucket(file.path(), file.as_file(), bucket, &mut found)
                .unwrap();
            assert_eq!(
                found[1..],
                scanned,
                "bucket {bucket}: appended after what was there"
            );
        }
        let mut seen = Vec::new();
        table
            .check_each(file.path(), file.as_file(), |c| {
                seen.push(c.clone());
                Ok(())
            })
            .unwrap();
        let mut sorted = chunks.clone();
        sorted.sort_by_key(|c| (c.bucket, c.offset));
        assert_eq!(seen, sorted);
        let error = table
            .read_bucket(file.path(), file.as_file(), 11, &mut Vec::new())
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("bucket 11 is past its 11 buckets"),
            "{error}"
        );
    }

    #[test]
    fn an_empty_table_lists_nothing() {
        let (table, file) = written(&[], 3);
        assert_eq!((table.chunks, table.bytes()), (0, 32));
        let mut found = Vec::new();
        for bucket in 0..3 {
            table
                .read_bucket(file.path(), file.as_file(), bucket, &mut found)
                .unwrap();
        }
        assert!(found.is_empty());
        table
            .check_each(file.path(), file.as_file(), |_| panic!("no chunk"))
            .unwrap();
    }

    /// `table`'s file at `path` with the u64 at `offset` replaced by `value`.
    fn overwrite(path: &Path, offset: u64, value: u64) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[offset as usize..offset as usize + 8].copy_from_slice(&value.to_le_bytes());
        std::fs::write(path, bytes).unwrap();
    }

    /// What reading `bucket`, and checking the whole table, say of the table of `chunks`
    /// over 3 buckets with the u64 at `at(table)` replaced by `value`.
    fn errors_with(
        chunks: &[SpillChunk],
        at: impl Fn(&ChunkTable) -> u64,
        value: u64,
        bucket: u64,
    ) -> (String, String) {
        let (table, file) = written(chunks, 3);
        overwrite(file.path(), at(&table), value);
        let read = table.read_bucket(file.path(), file.as_file(), bucket, &mut Vec::new());
        let checked = table.check_each(file.path(), file.as_file(), |_| Ok(()));
        let error = |result: Result<()>| result.map_or_else(|e| e.to_string(), |_| "ok".into());
        (error(read), error(checked))
    }

    #[test]
    fn a_damaged_table_is_named_and_never_asks_for_more_than_the_spill_holds() {
        let chunks = chunks_of(&[2, 0, 1, 2, 0]);
        // A start past the entries.
        let (read, checked) = errors_with(&chunks, |_| 8, 99, 0);
        assert!(read.contains("bucket 0 at entries 0..99 of 5"), "{read}");
        assert!(checked.contains("starts are out of order"), "{checked}");
        // A length past the spill file (bucket 0's first entry, its second field).
        let (read, checked) = errors_with(&chunks, |t| t.entry_offset(0) + 8, 1 << 40, 0);
        for error in [&read, &checked] {
            assert!(error.contains("does not fit the"), "{error}");
            assert!(error.contains("the work file is damaged"), "{error}");
        }
        // More pulses than its bytes hold.
        let (read, _) = errors_with(&chunks, |t| t.entry_offset(4) + 24, 1 << 30, 2);
        assert!(read.contains("1073741824 pulses"), "{read}");
        // A changed checksum field: every entry still plausible, the table's sum is not.
        let (read, checked) = errors_with(&chunks, |t| t.entry_offset(1) + 32, 7, 0);
        assert_eq!(read, "ok", "a read trusts the table its index made durable");
        assert!(checked.contains("has checksum"), "{checked}");
        let (table, file) = written(&chunks, 3);
        overwrite(file.path(), table.entry_offset(1) + 32, 7);
        let mut seen = 0;
        let error = table
            .check_each(file.path(), file.as_file(), |_| {
                seen += 1;
                Ok(())
            })
            .unwrap_err();
        assert!(error.to_string().contains("has checksum"), "{error}");
        assert_eq!(seen, 5, "every entry was seen before the sum was known");
        // Cut short.
        file.as_file().set_len(table.bytes() - 1).unwrap();
        let error = table
            .check_each(file.path(), file.as_file(), |_| Ok(()))
            .unwrap_err();
        assert!(
            error.to_string().contains("bytes, its index says"),
            "{error}"
        );
    }
}
