//! A shard cut short while it is mapped: the process still ends (SIGBUS), but its last line
//! names the file and the byte instead of a bare "Bus error".

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;

use common::*;
use shardify::dataset::{ChecksumPolicy, Dataset};

/// Set in the children these tests run: the dataset directory a child reads and then
/// truncates.
const CHILD: &str = "SHARDIFY_FAULT_REPORT_CHILD";

/// The line a stand-in for Python's `faulthandler` writes each time it is called.
const PREVIOUS_ACTION_LINE: &str = "the action before: handling SIGBUS";

#[test]
fn a_shard_cut_short_while_mapped_is_named_before_the_process_ends() {
    const NAME: &str = "a_shard_cut_short_while_mapped_is_named_before_the_process_ends";
    if let Some(dir) = std::env::var_os(CHILD) {
        read_a_shard_cut_short(Path::new(&dir), 1);
    }
    // Handed on to what Rust's runtime installed before it (its stack-overflow check, which
    // leaves a fault elsewhere to the default action): the process ends by the signal.
    let (out, stderr) = run_as_child(NAME);
    assert_names_the_shard_once(&out, &stderr);
}

/// Eight threads fault on the cut shard at once, in a process where an action like
/// Python's `faulthandler` was installed before ours (it writes, takes its time, puts the
/// default back and raises the signal again): one report, one call of that action, and
/// the process ends by SIGBUS. The threads' reports and handlers ran together before:
/// 2 reports in 31 of 100 runs of test_errors.py's script on a loaded 2-core machine, 5
/// of which ended by SIGSEGV, two `faulthandler` dumps interleaved.
#[test]
fn threads_faulting_at_once_hand_the_fault_on_once() {
    const NAME: &str = "threads_faulting_at_once_hand_the_fault_on_once";
    if let Some(dir) = std::env::var_os(CHILD) {
        install_a_slow_action_before_ours();
        read_a_shard_cut_short(Path::new(&dir), 8);
    }
    let (out, stderr) = run_as_child(NAME);
    assert_names_the_shard_once(&out, &stderr);
    assert_eq!(stderr.matches(PREVIOUS_ACTION_LINE).count(), 1, "{stderr}");
}

/// Converts the fixtures into a temporary dataset, then runs the test binary again, only
/// the test `name`, as its child on that dataset; the dataset and the child's stderr.
fn run_as_child(name: &str) -> (TempDataset, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(1, 1)).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, &out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&child.stderr).into_owned();
    assert_eq!(child.status.signal(), Some(libc::SIGBUS), "{stderr}");
    (
        TempDataset {
            _dir: dir,
            path: out,
        },
        stderr,
    )
}

/// A converted dataset in a directory removed when it is dropped.
struct TempDataset {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

/// Checks that `stderr` names shard 0 and a byte past the 100 left of it, once.
fn assert_names_the_shard_once(dataset: &TempDataset, stderr: &str) {
    let shard = dataset.path.join("shard_00000.safetensors");
    let line = format!(
        "shardify: bus error (SIGBUS) reading {} at byte ",
        shard.display()
    );
    assert_eq!(stderr.matches("shardify: bus error").count(), 1, "{stderr}");
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

/// Maps shard 0, cuts it to 100 bytes and reads its last pulse on `threads` threads at
/// once: never returns.
fn read_a_shard_cut_short(dir: &Path, threads: usize) -> ! {
    let dataset = Dataset::open(dir, ChecksumPolicy::Off).unwrap();
    let columns = dataset.shard(0).unwrap().columns().unwrap();
    let view = columns.view();
    let last = view.pulse_auxiliary.len() - 1;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("shard_00000.safetensors"))
        .unwrap();
    file.set_len(100).unwrap();
    let start = Barrier::new(threads);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                start.wait();
                // SAFETY: a reference to a live element of the map; the read faults, which
                // is what the test wants (volatile, so that it is made).
                unsafe { std::ptr::read_volatile(&view.pulse_auxiliary[last]) }
            });
        }
    });
    panic!("the reads past the file's end returned instead of faulting");
}

/// Installs, for SIGBUS, a handler that does what Python's `faulthandler` does: writes
/// (one line), takes its time (20 ms, its traceback dump), puts the default action back
/// and raises the signal again.
fn install_a_slow_action_before_ours() {
    extern "C" fn like_faulthandler(signal: libc::c_int) {
        // SAFETY: the test's stand-in handler: writes of valid buffers, a sleep, the
        // default action put back, and the signal raised, all async-signal-safe.
        unsafe {
            for part in [PREVIOUS_ACTION_LINE, "\n"] {
                libc::write(2, part.as_ptr().cast(), part.len());
            }
            libc::usleep(20_000);
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }
    // SAFETY: installing a plain handler with the signature `signal` expects.
    let previous = unsafe { libc::signal(libc::SIGBUS, like_faulthandler as *const () as usize) };
    assert_ne!(previous, libc::SIG_ERR);
}
