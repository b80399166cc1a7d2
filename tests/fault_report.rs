//! A shard cut short while it is mapped: the process still ends (SIGBUS), but its last line
//! names the file and the byte instead of a bare "Bus error".

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::*;
use shardify::dataset::{ChecksumPolicy, Dataset};

/// Set in the child this test runs: the dataset directory it reads and then truncates.
const CHILD: &str = "SHARDIFY_FAULT_REPORT_CHILD";

#[test]
fn a_shard_cut_short_while_mapped_is_named_before_the_process_ends() {
    if let Some(dir) = std::env::var_os(CHILD) {
        read_a_shard_cut_short(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(1, 1)).unwrap();
    // The test binary again, running only this test, as the child above.
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_shard_cut_short_while_mapped_is_named_before_the_process_ends",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&child.stderr);
    // Handed on to what Rust's runtime installed before it (its stack-overflow check, which
    // leaves a fault elsewhere to the default action): the process ends by the signal.
    assert_eq!(child.status.signal(), Some(libc::SIGBUS), "{stderr}");
    let shard = out.join("shard_00000.safetensors");
    let line = format!(
        "shardify: bus error (SIGBUS) reading {} at byte ",
        shard.display()
    );
    let at = stderr.find(&line).unwrap_or_else(|| panic!("{stderr}"));
    let byte: u64 = stderr[at + line.len()..]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        byte >= 4096,
        "past the page the 100 bytes left still fill: {byte}"
    );
    assert!(stderr.contains("`shardify copy`"), "{stderr}");
}

/// Maps shard 0, cuts it to 100 bytes and reads its last pulse: never returns.
fn read_a_shard_cut_short(dir: &Path) -> ! {
    let dataset = Dataset::open(dir, ChecksumPolicy::Off).unwrap();
    let columns = dataset.shard(0).unwrap().columns().unwrap();
    let view = columns.view();
    let last = view.pulse_auxiliary.len() - 1;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("shard_00000.safetensors"))
        .unwrap();
    file.set_len(100).unwrap();
    // SAFETY: a reference to a live element of the map; the read faults, which is what the
    // test wants (volatile, so that it is made).
    let value = unsafe { std::ptr::read_volatile(&view.pulse_auxiliary[last]) };
    panic!("the read past the file's end returned {value} instead of faulting");
}
