//! Spill files: pass 1 buffers events, each tagged with its shuffle key, and writes them
//! out sorted by bucket when the buffer is full, a chunk per bucket; pass 2 reads back one
//! bucket's chunks from every spill file. The [chunk table](super::chunk_table) beside the spill file
//! lists each chunk with its bucket, place and checksum; the index (JSON) sums the batch up.
//!
//! Event record (little-endian): `key u64, event_id i64, batch_id i64, first_row u64,
//! azimuth f64, zenith f64, n u64`, then `n` sensor ids (i32), times, charges and auxiliary
//! flags (u8). Times are i32 when bit 63 of `n` is set (else i64), charges f32 when bit 62
//! is set (else f64): chosen per event, only where every value round-trips, so the spill is
//! lossless and about 40% smaller for Kaggle data.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::chunk_table::ChunkTable;
use crate::error::{Error, IoContext, Result};
use crate::event::{EventHeader, RawEvent, ValueRange};
use crate::format::checksum::{self, Checksum};
use crate::format::pod::{as_bytes, extend_from_bytes};
use crate::pack::fit_capacity;

const TIME_32: u64 = 1 << 63;
const CHARGE_32: u64 = 1 << 62;
const COUNT_MASK: u64 = CHARGE_32 - 1;
/// Bytes of a record before its pulses.
pub const RECORD_HEADER_BYTES: u64 = 56;
/// The fewest bytes a pulse takes in a record: a sensor id, a narrow time and charge, and
/// its auxiliary flag.
pub const MIN_PULSE_BYTES: u64 = 4 + 4 + 4 + 1;

/// One run of records of one bucket inside a spill file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpillChunk {
    /// The bucket.
    pub bucket: u64,
    /// Byte offset in the spill file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Events in the chunk.
    pub events: u64,
    /// Pulses in the chunk.
    pub pulses: u64,
    /// XXH3-64 of the chunk (16 hex digits in the index file).
    #[serde(with = "checksum::hex_u64")]
    pub xxh3: u64,
}

/// The index of a finished spill file (the marker of a finished scatter unit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpillIndex {
    /// The batch it came from.
    pub batch_id: i64,
    /// Events read.
    pub events: u64,
    /// Pulses read.
    pub pulses: u64,
    /// Size of the spill file in bytes.
    pub spill_bytes: u64,
    /// Value ranges seen, for the narrowing decision.
    pub range: ValueRange,
    /// The chunks, listed by bucket in the table beside the spill file.
    pub table: ChunkTable,
}

/// The error of a damaged work file at `path`, saying how to recover.
pub(super) fn damaged(path: &Path, problem: String) -> Error {
    Error::Spill {
        path: path.to_path_buf(),
        problem: format!(
            "{problem}; the work file is damaged (a crash of the machine?): delete it and its \
             batch's .json index, then run the scatter phase again"
        ),
    }
}

/// Reads `chunk` of the spill file `file` (at `path`) into `scratch`, checking it against
/// the checksum its table gives.
pub fn read_checked_chunk(
    path: &Path,
    file: &File,
    chunk: &SpillChunk,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    scratch.resize(chunk.len as usize, 0);
    file.read_exact_at(scratch, chunk.offset).at(path)?;
    let found = checksum::value_of_bytes(scratch);
    if found != chunk.xxh3 {
        return Err(damaged(
            path,
            format!(
                "chunk at offset {} has checksum {}, its table says {}",
                chunk.offset,
                checksum::hex(found),
                checksum::hex(chunk.xxh3)
            ),
        ));
    }
    Ok(())
}

fn put(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

/// Appends one event record to `buf`.
pub fn encode_event(buf: &mut Vec<u8>, key: u64, event: &RawEvent) {
    let h = event.header();
    let time_32 = event.time.iter().all(|&t| t as i32 as i64 == t);
    let charge_32 = event.charge.iter().all(|&c| c as f32 as f64 == c);
    let mut n = event.len() as u64;
    n |= if time_32 { TIME_32 } else { 0 } | if charge_32 { CHARGE_32 } else { 0 };
    put(buf, key);
    put(buf, h.event_id as u64);
    put(buf, h.batch_id as u64);
    put(buf, h.first_row);
    put(buf, h.azimuth.to_bits());
    put(buf, h.zenith.to_bits());
    put(buf, n);
    buf.extend_from_slice(as_bytes(&event.sensor_id));
    if time_32 {
        buf.extend(event.time.iter().flat_map(|&t| (t as i32).to_le_bytes()));
    } else {
        buf.extend_from_slice(as_bytes(&event.time));
    }
    if charge_32 {
        buf.extend(event.charge.iter().flat_map(|&c| (c as f32).to_le_bytes()));
    } else {
        buf.extend_from_slice(as_bytes(&event.charge));
    }
    buf.extend_from_slice(&event.auxiliary);
}

/// Bytes of the chunks a scatter unit aims at per bucket: a unit buffers at least this much
/// per bucket where its memory allows (see `ConvertOptions::scatter_buffer`), so that the
/// gather reads its chunks in pieces large enough to read efficiently.
pub const CHUNK_AIM_BYTES: usize = 16 << 10;

/// The first allocation of a writer's buffer; it doubles from there up to its capacity, so
/// a large capacity is taken only as the events fill it (reserved whole, a 64 GiB limit
/// over a small input asked the allocator for tens of GiB at once, and a machine with less
/// memory aborted).
const FIRST_BUFFER_BYTES: usize = 64 << 10;

/// Buffers records in arrival order, whatever their bucket, up to a fixed capacity; when
/// the next would not fit, sorts them by bucket and writes each bucket's as one chunk (in
/// arrival order within it). Its memory is the capacity whatever the number of buckets;
/// more buckets make smaller chunks. (A buffer per bucket, as before, took at least 16 KiB
/// for each bucket a batch reached, which under a small limit or with small shards was
/// more than the limit: 1M events under 64 MiB with 256 KiB shards peaked at 155.9 MiB.)
pub struct SpillWriter<'w, W: Write> {
    out: &'w mut W,
    offset: u64,
    records: Vec<u8>,
    entries: Vec<Buffered>,
    capacity: usize,
    chunks: Vec<SpillChunk>,
    record: Vec<u8>,
}

/// A record in a writer's buffer.
#[derive(Debug, Clone, Copy)]
struct Buffered {
    bucket: u64,
    start: usize,
    len: usize,
    pulses: u64,
}

/// What a buffered record costs a writer besides its bytes: its entry, counted as the
/// buffer fills. The entries' vector grows by doubling, so it may hold up to as much again
/// as its entries in use: a few percent of the buffer for events of the real statistics
/// (1.4 KB records beside 32-byte entries), up to half for one-pulse events. (Counting
/// the vectors as allocated instead kept the records' vector of a 4 MiB buffer under
/// glibc's mmap threshold, in the heap: over 1M events under 64 MiB the scatter's peak
/// rose from 37.1-37.7 MiB to 39.6-42.4.)
const BUFFERED_RECORD_BYTES: usize = std::mem::size_of::<Buffered>();

impl<'w, W: Write> SpillWriter<'w, W> {
    /// A writer holding at most about `capacity` bytes of records in memory.
    pub fn new(out: &'w mut W, capacity: usize) -> Self {
        SpillWriter {
            out,
            offset: 0,
            records: Vec::new(),
            entries: Vec::new(),
            capacity,
            chunks: Vec::new(),
            record: Vec::new(),
        }
    }

    /// The bytes buffered, and their entries.
    fn held(&self) -> usize {
        self.records.len() + self.entries.len() * BUFFERED_RECORD_BYTES
    }

    /// Adds an event to `bucket`.
    pub fn push(&mut self, bucket: usize, key: u64, event: &RawEvent) -> std::io::Result<()> {
        self.record.clear();
        encode_event(&mut self.record, key, event);
        let adds = self.record.len() + BUFFERED_RECORD_BYTES;
        if self.held() + adds > self.capacity {
            self.flush()?;
        }
        let needed = self.records.len() + self.record.len();
        if needed > self.records.capacity() {
            let grown = (2 * self.records.capacity())
                .max(FIRST_BUFFER_BYTES)
                .min(self.capacity)
                .max(needed);
            self.records.reserve_exact(grown - self.records.len());
        }
        self.entries.push(Buffered {
            bucket: bucket as u64,
            start: self.records.len(),
            len: self.record.len(),
            pulses: event.len() as u64,
        });
        self.records.extend_from_slice(&self.record);
        if self.held() > self.capacity {
            // A single event larger than the buffer goes out on its own.
            self.flush()?;
        }
        Ok(())
    }

    /// Writes what is buffered, a chunk per bucket, in bucket order.
    fn flush(&mut self) -> std::io::Result<()> {
        // By bucket, then arrival (a record's start is its own).
        self.entries
            .sort_unstable_by_key(|entry| (entry.bucket, entry.start));
        for group in self.entries.chunk_by(|a, b| a.bucket == b.bucket) {
            let mut sum = Checksum::new();
            let (mut len, mut pulses) = (0, 0);
            for entry in group {
                let bytes = &self.records[entry.start..entry.start + entry.len];
                self.out.write_all(bytes)?;
                sum.update(bytes);
                len += entry.len as u64;
                pulses += entry.pulses;
            }
            self.chunks.push(SpillChunk {
                bucket: group[0].bucket,
                offset: self.offset,
                len,
                events: group.len() as u64,
                pulses,
                xxh3: sum.value(),
            });
            self.offset += len;
        }
        self.records.clear();
        self.entries.clear();
        Ok(())
    }

    /// Writes what is buffered; returns the chunks and the bytes written.
    pub fn finish(mut self) -> std::io::Result<(Vec<SpillChunk>, u64)> {
        self.flush()?;
        Ok((self.chunks, self.offset))
    }
}

/// The events of one bucket, decoded, with their pulses in shared columns.
#[derive(Debug, Default)]
pub struct BucketEvents {
    /// Per event: shuffle key, header, and its pulse range in the columns.
    pub records: Vec<(u64, EventHeader, std::ops::Range<usize>)>,
    /// All pulses' columns, event after event.
    pub pulses: RawEvent,
    narrow_time: Vec<i32>,
    narrow_charge: Vec<f32>,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

impl BucketEvents {
    /// Empties the bucket, keeping its allocations for the next one.
    pub fn clear(&mut self) {
        self.records.clear();
        self.pulses.clear();
    }

    /// Makes room for `events` more events and `pulses` more pulses, and little more (see
    /// [`fit_capacity`]).
    pub fn reserve(&mut self, events: usize, pulses: usize) {
        fit_capacity(&mut self.records, events);
        let p = &mut self.pulses;
        fit_capacity(&mut p.sensor_id, pulses);
        fit_capacity(&mut p.time, pulses);
        fit_capacity(&mut p.charge, pulses);
        fit_capacity(&mut p.auxiliary, pulses);
    }

    /// Reads and decodes one chunk of `file`, checking its checksum.
    pub fn read_chunk(
        &mut self,
        path: &Path,
        file: &File,
        chunk: &SpillChunk,
        scratch: &mut Vec<u8>,
    ) -> Result<()> {
        read_checked_chunk(path, file, chunk, scratch)?;
        self.decode(scratch).ok_or_else(|| {
            damaged(
                path,
                format!("chunk at offset {} is truncated", chunk.offset),
            )
        })
    }

    fn decode(&mut self, bytes: &[u8]) -> Option<()> {
        let mut c = Cursor { bytes, at: 0 };
        while c.at < bytes.len() {
            let key = c.u64()?;
            let header = EventHeader {
                event_id: c.u64()? as i64,
                batch_id: c.u64()? as i64,
                first_row: c.u64()?,
                azimuth: f64::from_bits(c.u64()?),
                zenith: f64::from_bits(c.u64()?),
            };
            let flags = c.u64()?;
            let n = (flags & COUNT_MASK) as usize;
            if n > bytes.len() {
                return None;
            }
            let start = self.pulses.len();
            extend_from_bytes(&mut self.pulses.sensor_id, c.take(4 * n)?);
            if flags & TIME_32 != 0 {
                self.narrow_time.clear();
                extend_from_bytes(&mut self.narrow_time, c.take(4 * n)?);
                self.pulses
                    .time
                    .extend(self.narrow_time.iter().map(|&t| t as i64));
            } else {
                extend_from_bytes(&mut self.pulses.time, c.take(8 * n)?);
            }
            if flags & CHARGE_32 != 0 {
                self.narrow_charge.clear();
                extend_from_bytes(&mut self.narrow_charge, c.take(4 * n)?);
                self.pulses
                    .charge
                    .extend(self.narrow_charge.iter().map(|&q| q as f64));
            } else {
                extend_from_bytes(&mut self.pulses.charge, c.take(8 * n)?);
            }
            self.pulses.auxiliary.extend_from_slice(c.take(n)?);
            self.records.push((key, header, start..start + n));
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(time: Vec<i64>, charge: Vec<f64>) -> RawEvent {
        RawEvent {
            header: Some(EventHeader {
                event_id: 42,
                batch_id: 3,
                first_row: 7,
                azimuth: 1.5,
                zenith: f64::NAN,
            }),
            sensor_id: vec![1; time.len()],
            auxiliary: (0..time.len() as u8).map(|i| i % 2).collect(),
            time,
            charge,
        }
    }

    #[test]
    fn records_round_trip_narrow_and_wide() {
        let narrow = event(vec![-5, 9], vec![0.25, 3.0]);
        let wide = event(vec![-5, 1 << 40, 3], vec![0.1, 2.0, f64::MAX]);
        let mut file = tempfile::tempfile().unwrap();
        let mut writer = SpillWriter::new(&mut file, 1 << 20);
        writer.push(2, 99, &narrow).unwrap();
        writer.push(0, 98, &wide).unwrap();
        writer.push(2, 97, &wide).unwrap();
        let (chunks, bytes) = writer.finish().unwrap();
        assert_eq!(chunks.len(), 2);
        assert_eq!(
            bytes,
            3 * RECORD_HEADER_BYTES + 2 * (4 + 4 + 4 + 1) + 2 * 3 * (4 + 8 + 8 + 1)
        );
        let mut bucket = BucketEvents::default();
        let c2 = chunks.iter().find(|c| c.bucket == 2).unwrap();
        assert_eq!((c2.events, c2.pulses), (2, 5));
        bucket
            .read_chunk(Path::new("x"), &file, c2, &mut Vec::new())
            .unwrap();
        assert_eq!(bucket.records.len(), 2);
        let (key, header, range) = bucket.records[0].clone();
        assert_eq!(
            (key, header.event_id, header.first_row, range),
            (99, 42, 7, 0..2)
        );
        assert!(header.zenith.is_nan());
        assert_eq!(
            bucket.pulses.slice(bucket.records[1].2.clone()).time,
            &[-5, 1 << 40, 3]
        );
        assert_eq!(bucket.pulses.time[..2], [-5, 9]);
        assert_eq!(bucket.pulses.charge, vec![0.25, 3.0, 0.1, 2.0, f64::MAX]);
        assert_eq!(bucket.pulses.auxiliary, vec![0, 1, 0, 1, 0]);
        let mut bad = chunks[1].clone();
        bad.xxh3 ^= 1;
        let e = bucket
            .read_chunk(Path::new("x"), &file, &bad, &mut Vec::new())
            .unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
    }

    #[test]
    fn an_index_writes_chunk_checksums_as_hex_and_reads_them_back() {
        let chunk = SpillChunk {
            bucket: 3,
            offset: 4096,
            len: 100,
            events: 2,
            pulses: 9,
            xxh3: checksum::value_of_bytes(b"chunk"),
        };
        let text = serde_json::to_string(&chunk).unwrap();
        // The same text as the hex checksums of every other file of the project.
        assert!(
            text.contains(&format!("\"xxh3\":\"{}\"", checksum::of_bytes(b"chunk"))),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<SpillChunk>(&text).unwrap(), chunk);
        let hex = format!("\"{}\"", checksum::of_bytes(b"chunk"));
        for (bad, says) in [
            ("\"12\"", "is not 16 hex digits"),
            ("\"zzzzzzzzzzzzzzzz\"", "is not 16 hex digits"),
            ("12", "expected a borrowed string"),
        ] {
            let e = serde_json::from_str::<SpillChunk>(&text.replace(&hex, bad)).unwrap_err();
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    /// Every chunk of `written`, decoded: its bucket and the keys of its events, in order.
    fn decoded(written: &[u8], chunks: &[SpillChunk]) -> Vec<(u64, Vec<u64>)> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(written).unwrap();
        chunks
            .iter()
            .map(|c| {
                let mut bucket = BucketEvents::default();
                bucket
                    .read_chunk(Path::new("x"), &file, c, &mut Vec::new())
                    .unwrap();
                assert_eq!(
                    (bucket.records.len() as u64, bucket.pulses.len() as u64),
                    (c.events, c.pulses)
                );
                (c.bucket, bucket.records.iter().map(|r| r.0).collect())
            })
            .collect()
    }

    #[test]
    fn memory_stays_within_the_capacity_whatever_the_buckets() {
        let mut rng = crate::rng::Rng::new(3);
        // Small events too, whose entries are a third of what they take.
        for (buckets, pulses) in [(4, 100), (10_000, 100), (4, 1), (10_000, 1)] {
            let e = event(vec![1; pulses], vec![1.0; pulses]);
            let mut sink = Vec::new();
            let mut writer = SpillWriter::new(&mut sink, 256 << 10);
            let mut expected = vec![Vec::new(); buckets];
            for key in 0..6000 {
                let bucket = rng.next_u64() as usize % buckets;
                writer.push(bucket, key, &e).unwrap();
                expected[bucket].push(key);
                let what = format!("{buckets} buckets, {pulses} pulses");
                assert!(writer.held() <= 256 << 10, "{what}: {}", writer.held());
                assert!(writer.records.capacity() <= 256 << 10, "{what}");
                // The entries' doubling takes a few percent more with these 1.4 KB records,
                // half as much again with records of one pulse (69 bytes).
                let allocated =
                    writer.records.capacity() + writer.entries.capacity() * BUFFERED_RECORD_BYTES;
                let bound = if pulses == 1 {
                    3 * 256 / 2
                } else {
                    105 * 256 / 100
                };
                assert!(allocated <= bound << 10, "{what}: {allocated}");
            }
            let (chunks, written) = writer.finish().unwrap();
            assert_eq!(written as usize, sink.len());
            assert!(chunks.iter().all(|c| c.len <= 256 << 10));
            // Each bucket's events, in the order they came, across its chunks in file order.
            let mut found = vec![Vec::new(); buckets];
            for (bucket, keys) in decoded(&sink, &chunks) {
                assert!(!keys.is_empty());
                found[bucket as usize].extend(keys);
            }
            assert_eq!(found, expected, "{buckets} buckets, {pulses} pulses");
            // A flush writes its chunks in bucket order: each fall in bucket starts another.
            let mut flushes = vec![0];
            for (at, c) in chunks.iter().enumerate() {
                if at > 0 && c.bucket < chunks[at - 1].bucket {
                    flushes.push(0);
                }
                *flushes.last_mut().unwrap() += c.len + c.events * BUFFERED_RECORD_BYTES as u64;
            }
            let (_, full) = flushes.split_last().unwrap();
            assert!(
                !full.is_empty() && full.iter().all(|&b| b >= (256 << 10) * 95 / 100),
                "{buckets} buckets, {pulses} pulses: {flushes:?}"
            );
            // Offsets follow one another: the chunks tile the file.
            assert!(chunks
                .windows(2)
                .all(|w| w[0].offset + w[0].len == w[1].offset));
        }
    }

    #[test]
    fn a_flush_writes_one_chunk_per_bucket_buffered() {
        let e = event(vec![1; 10], vec![1.0; 10]);
        let record = {
            let mut r = Vec::new();
            encode_event(&mut r, 0, &e);
            r.len() + BUFFERED_RECORD_BYTES
        };
        let mut sink = Vec::new();
        // Room for exactly 6 records: buckets 2, 0, 2, 1, 0, 2, then 1 and 1.
        let mut writer = SpillWriter::new(&mut sink, 6 * record);
        for (key, bucket) in [2, 0, 2, 1, 0, 2, 1, 1].into_iter().enumerate() {
            writer.push(bucket, key as u64, &e).unwrap();
        }
        let (chunks, _) = writer.finish().unwrap();
        assert_eq!(
            decoded(&sink, &chunks),
            [
                (0, vec![1, 4]),
                (1, vec![3]),
                (2, vec![0, 2, 5]),
                (1, vec![6, 7])
            ]
        );
    }

    #[test]
    fn a_large_capacity_is_taken_only_as_events_fill_it() {
        let e = event(vec![1; 100], vec![1.0; 100]);
        let mut sink = Vec::new();
        // A 64 GiB buffer (a big --memory-limit, a small input).
        let mut writer = SpillWriter::new(&mut sink, 64 << 30);
        for i in 0..400 {
            writer.push(i % 2, i as u64, &e).unwrap();
            let (held, len) = (writer.records.capacity(), writer.records.len());
            assert!(
                held <= (2 * len).max(FIRST_BUFFER_BYTES),
                "{held} bytes held for {len} buffered"
            );
        }
        let (chunks, written) = writer.finish().unwrap();
        assert_eq!(
            chunks.len(),
            2,
            "one chunk per bucket: nothing flushed early"
        );
        assert_eq!(written as usize, sink.len());
        assert_eq!(chunks.iter().map(|c| c.events).sum::<u64>(), 400);
    }

    #[test]
    fn an_event_larger_than_the_buffer_goes_out_alone() {
        let small = event(vec![1; 2], vec![1.0; 2]);
        let large = event(vec![1; 200], vec![1.0; 200]);
        let mut sink = Vec::new();
        // The large record takes 56 + 200 * 13 bytes.
        let mut writer = SpillWriter::new(&mut sink, 2048);
        writer.push(1, 0, &small).unwrap();
        writer.push(1, 1, &large).unwrap();
        writer.push(1, 2, &small).unwrap();
        let (chunks, _) = writer.finish().unwrap();
        assert_eq!(
            decoded(&sink, &chunks),
            [(1, vec![0]), (1, vec![1]), (1, vec![2])]
        );
    }
}
