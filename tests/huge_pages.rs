//! How the shards are mapped: what the kernel says of this process's mappings
//! (`/proc/self/smaps`), and the huge-page hint a dataset that fits in memory gives when
//! its checksum reads a shard. Linux only; the share of huge pages itself depends on the
//! kernel and filesystem, so these tests check what shardify asks and counts, not what
//! the kernel grants.
#![cfg(target_os = "linux")]

mod common;

use common::*;
use shardify::dataset::huge_pages::shard_mapped_bytes;
use shardify::dataset::{page_size, ChecksumPolicy};
use std::path::Path;

/// The `VmFlags` of this process's mapping that starts at `address`.
fn mapping_flags(address: usize) -> Vec<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let header = format!("{address:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&header));
    assert!(lines.next().is_some(), "no mapping starts at {header}");
    let flags = lines
        .find(|l| l.starts_with("VmFlags:"))
        .expect("every mapping lists its flags");
    flags.split_whitespace().skip(1).map(String::from).collect()
}

/// Whether this kernel has transparent huge pages at all (the hint is refused otherwise).
fn kernel_has_huge_pages() -> bool {
    Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists()
}

#[test]
fn the_shards_mapped_bytes_are_counted_from_the_kernels_own_figures() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = fixture_dataset(dir.path(), 1, ChecksumPolicy::Full);
    let page = page_size();
    let mut touched = 0u64;
    let mut sum = 0u64;
    for i in 0..dataset.shard_count() {
        let bytes = dataset.shard(i).unwrap().bytes();
        sum += bytes
            .iter()
            .step_by(page)
            .map(|&b| u64::from(b))
            .sum::<u64>();
        touched += (bytes.len().div_ceil(page) * page) as u64;
    }
    std::hint::black_box(sum);
    let mapped = shard_mapped_bytes(&dataset).expect("Linux has /proc/self/smaps");
    // Every page touched is resident and mapped, the last partial page of each shard
    // included; nothing beyond the files is counted.
    assert!(
        mapped.resident >= touched - (page * dataset.shard_count()) as u64
            && mapped.resident <= touched,
        "{} resident of {touched} bytes touched",
        mapped.resident
    );
    assert!(mapped.huge <= mapped.resident);
    assert!(mapped.huge_fraction().is_some());
}

#[test]
fn only_the_shards_already_opened_are_counted_and_none_is_opened_to_count_it() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = fixture_dataset(dir.path(), 1, ChecksumPolicy::Lazy);
    assert!(dataset.shard_count() >= 2, "the fixture has several shards");
    let none = shard_mapped_bytes(&dataset).unwrap();
    assert_eq!(none.resident, 0);
    assert_eq!(
        dataset.opened_shards().count(),
        0,
        "counting opened nothing"
    );
    let first = dataset.shard(0).unwrap().bytes();
    let one = shard_mapped_bytes(&dataset).unwrap();
    // The checksum read the whole shard through its map.
    assert!(
        one.resident as usize >= first.len() / page_size() * page_size(),
        "{one:?}"
    );
    assert_eq!(dataset.opened_shards().count(), 1);
}

#[test]
fn a_dataset_that_fits_in_memory_asks_for_huge_pages_before_its_checksum_reads_a_shard() {
    let dir = tempfile::tempdir().unwrap();
    for (policy, asks) in [
        (ChecksumPolicy::Lazy, true),
        (ChecksumPolicy::Full, true),
        (ChecksumPolicy::Off, false),
    ] {
        let dataset = fixture_dataset(&dir.path().join(format!("{policy:?}")), 1, policy);
        assert_eq!(
            dataset.asks_for_huge_pages(),
            asks,
            "{policy:?}: a few MB fit in any machine's memory; only a policy that reads \
             shards whole asks"
        );
        for i in 0..dataset.shard_count() {
            let address = dataset.shard(i).unwrap().bytes().as_ptr() as usize;
            let flags = mapping_flags(address);
            assert_eq!(
                flags.iter().any(|f| f == "hg"),
                asks && kernel_has_huge_pages(),
                "{policy:?}, shard {i}: the map's flags {flags:?}"
            );
        }
    }
}
