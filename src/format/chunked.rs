//! A buffered writer that writes a new file in whole, aligned chunks: 2 MiB ones for the
//! files readers map (shards), so that Linux caches each chunk as one huge page.
//!
//! Linux filesystems with large folios in the page cache (ext4 from kernel 6.16, xfs) give
//! a write as large a folio as its size and file offset allow: an aligned 2 MiB write gets
//! one huge folio, which every process that maps the file then maps with one TLB entry
//! instead of 512. The loader reads shards through memory maps, events at random across a
//! window of tens of MB, so a shard cached in small pages costs it a page walk for most
//! column pieces it reads. Measured on the 2-core Ice Lake VM (kernel 6.18, ext4): shards
//! written through a 1 MiB buffer were 6% mapped in huge pages, in aligned 2 MiB chunks
//! 99%, and the loader delivered 3-14% more events/s at window 16 and 11-19% more at
//! window 64 from the latter (-1 to +8% at window 1), epochs alternated in one process
//! (docs/results.md, "Shards in huge pages"). Pages read back after the cache dropped
//! them are cached as the reads make them, whatever the writer did.

use std::io::Write;

/// The chunk of files that readers map: a huge page on x86-64 (and on arm64 with 4 KiB
/// pages).
pub const MAPPED_FILE_CHUNK: usize = 2 << 20;

/// The chunk of files read once, sequentially (convert's spill files): small enough that
/// their page cache takes no huge folios, which buy a sequential read nothing and cost the
/// writes that allocate them time (on the VM measured, convert's shard writes took 0.6-1.0
/// s more per 536 MiB in 2 MiB chunks than through a 1 MiB buffer).
pub const READ_ONCE_CHUNK: usize = 1 << 20;

/// Writes to `W` in whole chunks of `chunk` bytes, each at an offset of the stream that is
/// a multiple of `chunk`, and the rest at [`ChunkedWriter::finish`] (or a flush).
pub struct ChunkedWriter<W: Write> {
    inner: W,
    chunk: usize,
    /// The chunk being filled (fewer than `chunk` bytes between calls).
    pending: Vec<u8>,
}

impl<W: Write> ChunkedWriter<W> {
    /// A writer at the start of `inner` (a new file), writing chunks of `chunk` bytes (at
    /// least one).
    pub fn new(inner: W, chunk: usize) -> ChunkedWriter<W> {
        let chunk = chunk.max(1);
        ChunkedWriter {
            inner,
            chunk,
            pending: Vec::with_capacity(chunk),
        }
    }

    /// Writes the last, partial chunk and hands the writer back.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for ChunkedWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.pending.is_empty() && rest.len() >= self.chunk {
                // On a chunk boundary: whole chunks go straight from the caller's bytes.
                let whole = rest.len() - rest.len() % self.chunk;
                self.inner.write_all(&rest[..whole])?;
                rest = &rest[whole..];
                continue;
            }
            let taken = rest.len().min(self.chunk - self.pending.len());
            self.pending.extend_from_slice(&rest[..taken]);
            rest = &rest[taken..];
            if self.pending.len() == self.chunk {
                self.inner.write_all(&self.pending)?;
                self.pending.clear();
            }
        }
        Ok(bytes.len())
    }

    /// Writes the partial chunk held: later writes are then off the chunk grid, so only
    /// [`ChunkedWriter::finish`] should need it.
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.write_all(&self.pending)?;
        self.pending.clear();
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each write it is given: (offset in the stream, length).
    #[derive(Default)]
    struct Recorder {
        bytes: Vec<u8>,
        writes: Vec<(usize, usize)>,
    }

    impl Write for Recorder {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.writes.push((self.bytes.len(), bytes.len()));
            self.bytes.extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Writes `sizes` (cycled through until `total` bytes) of a counting pattern through a
    /// writer of `chunk`; returns what reached the inner writer.
    fn write_in(sizes: &[usize], total: usize, chunk: usize) -> (Vec<u8>, Recorder) {
        let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let mut writer = ChunkedWriter::new(Recorder::default(), chunk);
        let mut at = 0;
        for &size in sizes.iter().cycle() {
            if at == total {
                break;
            }
            let end = (at + size).min(total);
            writer.write_all(&data[at..end]).unwrap();
            at = end;
        }
        (data, writer.finish().unwrap())
    }

    #[test]
    fn every_write_but_the_last_is_whole_chunks_on_the_chunk_grid() {
        let chunk = 64;
        // Small and odd pieces, pieces of exactly a chunk, pieces of several chunks and a
        // bit, a zero-length piece, arriving both on and off the grid.
        let patterns: [&[usize]; 6] = [
            &[1],
            &[7, 13, 64, 0, 200],
            &[64],
            &[128, 5],
            &[300, 3, 1000],
            &[63, 65],
        ];
        for sizes in patterns {
            for total in [0, 1, 63, 64, 65, 640, 1000, 4099] {
                let (data, out) = write_in(sizes, total, chunk);
                assert_eq!(
                    out.bytes, data,
                    "{sizes:?}, {total} bytes: every byte, in order"
                );
                let Some((&last, whole)) = out.writes.split_last() else {
                    assert_eq!(total, 0, "{sizes:?}: nothing written for {total} bytes");
                    continue;
                };
                for &(offset, len) in whole {
                    assert!(
                        offset % chunk == 0 && len % chunk == 0 && len > 0,
                        "{sizes:?}, {total} bytes: write of {len} at {offset} is off the grid"
                    );
                }
                let (offset, len) = last;
                assert!(
                    offset % chunk == 0 && len > 0 && (len % chunk == 0 || len < chunk),
                    "{sizes:?}, {total} bytes: the last write ({len} at {offset}) is whole \
                     chunks or the tail, on the grid"
                );
            }
        }
    }

    #[test]
    fn a_flush_writes_what_is_pending() {
        let mut writer = ChunkedWriter::new(Recorder::default(), 64);
        writer.write_all(&[7; 10]).unwrap();
        assert!(
            writer.inner.writes.is_empty(),
            "held until a chunk is whole"
        );
        writer.flush().unwrap();
        assert_eq!(writer.inner.writes, vec![(0, 10)]);
        assert_eq!(
            writer.finish().unwrap().writes.len(),
            1,
            "nothing left to finish"
        );
    }
}
