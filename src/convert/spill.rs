//! Spill files: pass 1 appends each event, tagged with its shuffle key, to the buffer of its
//! bucket and writes full buffers out as chunks; pass 2 reads back one bucket's chunks from
//! every spill file. The index (JSON beside the spill file) lists each chunk with its
//! bucket, place and checksum.
//!
//! Event record (little-endian): `key u64, event_id i64, batch_id i64, first_row u64,
//! azimuth f64, zenith f64, n u64`, then `n` sensor ids (i32), times (i64), charges (f64)
//! and auxiliary flags (u8).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::event::{EventHeader, RawEvent, ValueRange};
use crate::format::checksum;

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
    /// XXH3-64 of the chunk, hex.
    pub xxh3: String,
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
    put(buf, key);
    put(buf, h.event_id as u64);
    put(buf, h.batch_id as u64);
    put(buf, h.first_row);
    put(buf, h.azimuth.to_bits());
    put(buf, h.zenith.to_bits());
    put(buf, event.len() as u64);
    buf.extend(event.sensor_id.iter().flat_map(|v| v.to_le_bytes()));
    buf.extend(event.time.iter().flat_map(|v| v.to_le_bytes()));
    buf.extend(event.charge.iter().flat_map(|v| v.to_le_bytes()));
    buf.extend_from_slice(&event.auxiliary);
}

/// Buffers records per bucket and writes them out as chunks once `budget` bytes are held.
pub struct SpillWriter<'w, W: Write> {
    out: &'w mut W,
    offset: u64,
    buffers: Vec<Vec<u8>>,
    counts: Vec<(u64, u64)>,
    buffered: usize,
    budget: usize,
    chunks: Vec<SpillChunk>,
}

impl<'w, W: Write> SpillWriter<'w, W> {
    /// A writer for `buckets` buckets holding at most about `budget` bytes in memory.
    pub fn new(out: &'w mut W, buckets: usize, budget: usize) -> Self {
        SpillWriter {
            out,
            offset: 0,
            buffers: vec![Vec::new(); buckets],
            counts: vec![(0, 0); buckets],
            buffered: 0,
            budget,
            chunks: Vec::new(),
        }
    }

    /// Adds an event to `bucket`.
    pub fn push(&mut self, bucket: usize, key: u64, event: &RawEvent) -> std::io::Result<()> {
        let buf = &mut self.buffers[bucket];
        let before = buf.len();
        encode_event(buf, key, event);
        self.buffered += buf.len() - before;
        self.counts[bucket].0 += 1;
        self.counts[bucket].1 += event.len() as u64;
        if self.buffered >= self.budget {
            self.flush_all()?;
        }
        Ok(())
    }

    fn flush_all(&mut self) -> std::io::Result<()> {
        for (bucket, buf) in self.buffers.iter_mut().enumerate() {
            if buf.is_empty() {
                continue;
            }
            self.out.write_all(buf)?;
            let (events, pulses) = std::mem::take(&mut self.counts[bucket]);
            self.chunks.push(SpillChunk {
                bucket: bucket as u64,
                offset: self.offset,
                len: buf.len() as u64,
                events,
                pulses,
                xxh3: checksum::of_bytes(buf),
            });
            self.offset += buf.len() as u64;
            buf.clear();
        }
        self.buffered = 0;
        Ok(())
    }

    /// Writes what is buffered; returns the chunks and the bytes written.
    pub fn finish(mut self) -> std::io::Result<(Vec<SpillChunk>, u64)> {
        self.flush_all()?;
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
        let damaged = |problem: String| Error::Spill {
            path: path.to_path_buf(),
            problem,
        };
        let found = checksum::of_bytes(scratch);
        if found != chunk.xxh3 {
            return Err(damaged(format!(
                "chunk at offset {} has checksum {found}, index says {}",
                chunk.offset, chunk.xxh3
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
            let n = c.u64()? as usize;
            if n.checked_mul(21)? > bytes.len() {
                return None;
            }
            let start = self.pulses.len();
            let p = &mut self.pulses;
            p.sensor_id.extend(
                c.take(4 * n)?
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes(b.try_into().unwrap())),
            );
            p.time.extend(
                c.take(8 * n)?
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap())),
            );
            p.charge.extend(
                c.take(8 * n)?
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().unwrap())),
            );
            p.auxiliary.extend_from_slice(c.take(n)?);
            self.records.push((key, header, start..start + n));
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_chunks() {
        let event = RawEvent {
            header: Some(EventHeader {
                event_id: 42,
                batch_id: 3,
                first_row: 7,
                azimuth: 1.5,
                zenith: f64::NAN,
            }),
            sensor_id: vec![1, 2],
            time: vec![-5, 9],
            charge: vec![0.25, 3.0],
            auxiliary: vec![1, 0],
        };
        let mut file = tempfile::tempfile().unwrap();
        let mut writer = SpillWriter::new(&mut file, 3, 10);
        writer.push(2, 99, &event).unwrap();
        writer.push(0, 98, &event).unwrap();
        let (chunks, bytes) = writer.finish().unwrap();
        assert_eq!(chunks.len(), 2);
        assert_eq!(bytes, 2 * (56 + 21 * 2));
        let mut bucket = BucketEvents::default();
        bucket
            .read_chunk(Path::new("x"), &file, &chunks[0], &mut Vec::new())
            .unwrap();
        assert_eq!(bucket.records.len(), 1);
        let (key, header, range) = bucket.records[0].clone();
        assert_eq!(
            (key, header.event_id, header.first_row, range),
            (99, 42, 7, 0..2)
        );
        assert!(header.zenith.is_nan());
        assert_eq!(bucket.pulses.time, vec![-5, 9]);
        let mut bad = chunks[1].clone();
        bad.xxh3 = "0000000000000000".into();
        let e = bucket
            .read_chunk(Path::new("x"), &file, &bad, &mut Vec::new())
            .unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
    }
}
