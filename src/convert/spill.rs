//! Spill files: pass 1 appends each event, tagged with its shuffle key, to the buffer of its
//! bucket and writes a buffer out as a chunk when it is full; pass 2 reads back one bucket's
//! chunks from every spill file. The index (JSON beside the spill file) lists each chunk with
//! its bucket, place and checksum.
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

use crate::error::{Error, IoContext, Result};
use crate::event::{EventHeader, RawEvent, ValueRange};
use crate::format::checksum;
use crate::format::pod::{as_bytes, extend_from_bytes};
use crate::pack::fit_capacity;

const TIME_32: u64 = 1 << 63;
const CHARGE_32: u64 = 1 << 62;
const COUNT_MASK: u64 = CHARGE_32 - 1;
/// Bytes of a record before its pulses.
pub const RECORD_HEADER_BYTES: u64 = 56;

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
    /// Chunks in file order.
    pub chunks: Vec<SpillChunk>,
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

/// The smallest buffer per bucket: smaller ones write chunks too small to read back
/// efficiently.
pub const MIN_BUFFER_BYTES: usize = 16 << 10;

/// A bucket's share of the scatter budget up to which its buffer is allocated whole at its
/// first event. Grown by doubling instead, a buffer leaves each smaller allocation behind
/// as a hole in the allocator's heap: measured over 1M events on 2 threads under a 256 MiB
/// limit (shares of 630 KiB), the scatter's peak was 260-272 MiB doubling and 233 MiB
/// allocated whole (with free memory handed back after each unit in both). Larger shares
/// still double, so a limit above the machine's memory asks for no more than the events
/// fill (see [`SpillWriter::push`]).
pub const WHOLE_SHARE_BYTES: usize = 4 << 20;

/// The capacity of each bucket's buffer when `buckets` share `budget` bytes.
pub fn buffer_capacity(budget: usize, buckets: usize) -> usize {
    (budget / buckets.max(1)).max(MIN_BUFFER_BYTES)
}

/// Buffers records per bucket (each buffer of a fixed capacity, so memory stays within the
/// budget) and writes a bucket's buffer out as a chunk when the next event would not fit.
pub struct SpillWriter<'w, W: Write> {
    out: &'w mut W,
    offset: u64,
    buffers: Vec<Vec<u8>>,
    counts: Vec<(u64, u64)>,
    capacity: usize,
    chunks: Vec<SpillChunk>,
    record: Vec<u8>,
}

impl<'w, W: Write> SpillWriter<'w, W> {
    /// A writer for `buckets` buckets holding at most about `budget` bytes in memory.
    pub fn new(out: &'w mut W, buckets: usize, budget: usize) -> Self {
        SpillWriter {
            out,
            offset: 0,
            buffers: vec![Vec::new(); buckets],
            counts: vec![(0, 0); buckets],
            capacity: buffer_capacity(budget, buckets),
            chunks: Vec::new(),
            record: Vec::new(),
        }
    }

    /// Adds an event to `bucket`.
    pub fn push(&mut self, bucket: usize, key: u64, event: &RawEvent) -> std::io::Result<()> {
        self.record.clear();
        encode_event(&mut self.record, key, event);
        if self.buffers[bucket].len() + self.record.len() > self.capacity {
            self.flush(bucket)?;
        }
        let buf = &mut self.buffers[bucket];
        let needed = buf.len() + self.record.len();
        if needed > buf.capacity() {
            // A small share is taken whole; a larger one by doubling up to the capacity,
            // never beyond: a bucket's share of a large budget is taken only as its events
            // fill it (reserved whole at the first event, a 64 GiB limit over few buckets
            // asked the allocator for tens of GiB at once, and a machine with less memory
            // aborted).
            let grown = if self.capacity <= WHOLE_SHARE_BYTES {
                self.capacity
            } else {
                (2 * buf.capacity()).clamp(MIN_BUFFER_BYTES, self.capacity)
            };
            buf.reserve_exact(grown.max(needed) - buf.len());
        }
        buf.extend_from_slice(&self.record);
        self.counts[bucket].0 += 1;
        self.counts[bucket].1 += event.len() as u64;
        if buf.len() > self.capacity {
            // A single event larger than a buffer goes out on its own.
            self.flush(bucket)?;
        }
        Ok(())
    }

    fn flush(&mut self, bucket: usize) -> std::io::Result<()> {
        let buf = &mut self.buffers[bucket];
        if buf.is_empty() {
            return Ok(());
        }
        self.out.write_all(buf)?;
        let (events, pulses) = std::mem::take(&mut self.counts[bucket]);
        self.chunks.push(SpillChunk {
            bucket: bucket as u64,
            offset: self.offset,
            len: buf.len() as u64,
            events,
            pulses,
            xxh3: checksum::value_of_bytes(buf),
        });
        self.offset += buf.len() as u64;
        buf.clear();
        if buf.capacity() > self.capacity {
            buf.shrink_to(self.capacity);
        }
        Ok(())
    }

    /// Writes what is buffered; returns the chunks and the bytes written.
    pub fn finish(mut self) -> std::io::Result<(Vec<SpillChunk>, u64)> {
        for bucket in 0..self.buffers.len() {
            self.flush(bucket)?;
        }
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
        scratch.resize(chunk.len as usize, 0);
        file.read_exact_at(scratch, chunk.offset).at(path)?;
        let damaged = |problem: String| {
            Error::Spill {
            path: path.to_path_buf(),
            problem: format!(
                "{problem}; the work file is damaged (a crash of the machine?): delete it and its .json index, \
                 then run the scatter phase again"
            ),
        }
        };
        let found = checksum::value_of_bytes(scratch);
        if found != chunk.xxh3 {
            return Err(damaged(format!(
                "chunk at offset {} has checksum {}, index says {}",
                chunk.offset,
                checksum::hex(found),
                checksum::hex(chunk.xxh3)
            )));
        }
        self.decode(scratch)
            .ok_or_else(|| damaged(format!("chunk at offset {} is truncated", chunk.offset)))
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
        let mut writer = SpillWriter::new(&mut file, 3, 1 << 20);
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

    #[test]
    fn memory_stays_within_the_budget() {
        let e = event(vec![1; 100], vec![1.0; 100]);
        let mut sink = Vec::new();
        let mut writer = SpillWriter::new(&mut sink, 4, 256 << 10);
        for i in 0..2000 {
            writer.push(i % 4, i as u64, &e).unwrap();
            let held: usize = writer.buffers.iter().map(|b| b.capacity()).sum();
            assert!(held <= 256 << 10, "{held}");
        }
        let (chunks, _) = writer.finish().unwrap();
        assert!(chunks.iter().all(|c| c.len <= 64 << 10));
        assert_eq!(chunks.iter().map(|c| c.events).sum::<u64>(), 2000);
    }

    #[test]
    fn a_large_budget_is_taken_only_as_events_fill_it() {
        let e = event(vec![1; 100], vec![1.0; 100]);
        let mut sink = Vec::new();
        // A 64 GiB budget over 2 buckets (a big --memory-limit, a small input).
        let mut writer = SpillWriter::new(&mut sink, 2, 64 << 30);
        for i in 0..40 {
            writer.push(i % 2, i as u64, &e).unwrap();
            for b in &writer.buffers {
                assert!(
                    b.capacity() <= (2 * b.len()).max(MIN_BUFFER_BYTES),
                    "{} bytes held for {} buffered",
                    b.capacity(),
                    b.len()
                );
            }
        }
        let held: Vec<usize> = writer.buffers.iter().map(|b| b.len()).collect();
        let (chunks, written) = writer.finish().unwrap();
        assert_eq!(
            chunks.len(),
            2,
            "one chunk per bucket: nothing flushed early"
        );
        assert_eq!(written as usize, held.iter().sum::<usize>());
        assert_eq!(chunks.iter().map(|c| c.events).sum::<u64>(), 40);
    }

    #[test]
    fn a_small_share_is_taken_whole_at_a_buckets_first_event() {
        let e = event(vec![1; 100], vec![1.0; 100]);
        let mut sink = Vec::new();
        // 8 buckets sharing 1 MiB: 128 KiB each, taken whole rather than by doubling
        // (whose smaller allocations stayed behind as holes in the heap).
        let mut writer = SpillWriter::new(&mut sink, 8, 1 << 20);
        writer.push(3, 7, &e).unwrap();
        let capacities: Vec<usize> = writer.buffers.iter().map(|b| b.capacity()).collect();
        assert_eq!(capacities, [0, 0, 0, 128 << 10, 0, 0, 0, 0]);
        for i in 0..2000 {
            writer.push(3, i, &e).unwrap();
            assert_eq!(writer.buffers[3].capacity(), 128 << 10, "after {i} events");
        }
    }
}
