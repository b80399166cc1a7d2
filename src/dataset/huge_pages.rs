//! How much of a dataset's mapped shards the kernel maps in huge pages: one TLB entry per
//! 2 MiB instead of per 4 KiB, which the loader's reads of events at random across a window
//! feel (see [`crate::format::chunked`]). It depends on how the page cache came to hold the
//! shards (written by `shardify convert`, copied, read back from disk), not on the loader,
//! so a benchmark reports it beside its figures. The same count covers any memory of the
//! process ([`mapped_bytes`]), the staging buffers batches are written to among it.

use std::ops::Range;

use super::{page_size, Dataset};

/// Bytes of this process's mappings inside some shard, as `/proc/self/smaps` counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MappedBytes {
    /// Resident and mapped (`Rss`).
    pub resident: u64,
    /// Of those, mapped in huge pages (`FilePmdMapped` for files, `AnonHugePages` for
    /// anonymous memory).
    pub huge: u64,
}

impl MappedBytes {
    /// The share of the resident bytes mapped in huge pages; `None` when nothing is mapped.
    pub fn huge_fraction(&self) -> Option<f64> {
        (self.resident > 0).then(|| self.huge as f64 / self.resident as f64)
    }
}

/// What this process maps of `dataset`'s opened shards, and in huge pages: `None` where
/// `/proc/self/smaps` cannot be read (not Linux). Shards read into memory rather than
/// mapped count nothing; shards not opened yet are not opened.
pub fn shard_mapped_bytes(dataset: &Dataset) -> Option<MappedBytes> {
    let shards: Vec<&[u8]> = dataset.opened_shards().map(|shard| shard.bytes()).collect();
    mapped_bytes(&shards)
}

/// What this process maps of the memory `regions` hold, and in huge pages: the mappings
/// that lie inside one of them (the tail of a region's last page counted with it). `None`
/// where `/proc/self/smaps` cannot be read (not Linux).
pub fn mapped_bytes(regions: &[&[u8]]) -> Option<MappedBytes> {
    let ranges: Vec<Range<usize>> = regions
        .iter()
        .map(|bytes| {
            let start = bytes.as_ptr() as usize;
            start..start + bytes.len()
        })
        .collect();
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    Some(tally(&smaps, &ranges, page_size()))
}

/// Sums `Rss` and the huge pages (`FilePmdMapped`, `AnonHugePages`) over the mappings of
/// `smaps` that lie inside one of `ranges` (a mapping ends on a page of `page` bytes, a
/// range where its bytes do).
fn tally(smaps: &str, ranges: &[Range<usize>], page: usize) -> MappedBytes {
    let mut total = MappedBytes::default();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some(span) = mapping_span(line) {
            inside = ranges
                .iter()
                .any(|r| r.start <= span.start && span.end <= r.end.next_multiple_of(page));
            continue;
        }
        if !inside {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(key), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(kib) = value.parse::<u64>() else {
            continue;
        };
        match key {
            "Rss:" => total.resident += kib * 1024,
            "FilePmdMapped:" | "AnonHugePages:" => total.huge += kib * 1024,
            _ => {}
        }
    }
    total
}

/// The address range of a mapping's header line (`start-end perms offset dev inode path`),
/// `None` for the lines of its fields.
fn mapping_span(line: &str) -> Option<Range<usize>> {
    let (span, rest) = line.split_once(' ')?;
    let (start, end) = span.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    // A field line ("Rss: 4 kB") has no '-' in its first word, and a header line has
    // its permissions next.
    rest.starts_with(['r', '-']).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0000400000 r--s 00000000 fd:00 12 /data/shard_00000.safetensors
Size:               4096 kB
Rss:                4096 kB
FilePmdMapped:      2048 kB
VmFlags: rd mr me ms
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
Size:               2048 kB
Rss:                2048 kB
FilePmdMapped:         0 kB
AnonHugePages:      2048 kB
7f1000000000-7f1000003000 r--s 00000000 fd:00 13 /data/shard_00001.safetensors
Size:                 12 kB
Rss:                   8 kB
FilePmdMapped:         0 kB
";

    #[test]
    fn only_the_shards_mappings_are_counted() {
        // The first shard ends off a page boundary; the second's mapping lies inside its
        // range; the anonymous mapping between them is no shard's.
        let ranges = [
            0x7f00_0000_0000..0x7f00_0000_0000 + 4 * 1024 * 1024 - 100,
            0x7f10_0000_0000..0x7f10_0000_2f00,
        ];
        let counted = tally(SMAPS, &ranges, 4096);
        assert_eq!(
            counted,
            MappedBytes {
                resident: (4096 + 8) * 1024,
                huge: 2048 * 1024
            }
        );
        assert_eq!(counted.huge_fraction(), Some(2048.0 / 4104.0));
        assert_eq!(tally(SMAPS, &ranges[1..], 4096).huge_fraction(), Some(0.0));
        assert_eq!(
            tally(SMAPS, &[], 4096).huge_fraction(),
            None,
            "nothing mapped"
        );
        let anonymous = 0x7f00_0040_0000..0x7f00_0060_0000;
        assert_eq!(
            tally(SMAPS, std::slice::from_ref(&anonymous), 4096),
            MappedBytes {
                resident: 2048 * 1024,
                huge: 2048 * 1024
            },
            "anonymous memory's huge pages"
        );
    }
}
