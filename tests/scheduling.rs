//! The loader's threads: named, and the gathering ones under the configured scheduling
//! policy, the consumer's thread untouched. A test binary of its own: it counts the
//! process's threads, which other tests' loaders would add to.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::device::DeviceChoice;
use shardify::pipeline::{Loader, LoaderConfig, WorkerScheduling, GATHER_THREAD_NAME};
use shardify::sampler::{Batching, SamplerConfig, SamplerState};

/// Every thread of this process: its id and name.
fn threads() -> BTreeMap<i32, String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let tid = entry.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            Some((tid, name.trim_end().to_string()))
        })
        .collect()
}

/// What `look` sees once `done` accepts it, or after 2 s (for the assertions to report).
fn within_2s<T>(mut look: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let seen = look();
        if done(&seen) || std::time::Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The scheduling policy of thread `tid` (of this process).
fn policy(tid: i32) -> i32 {
    // SAFETY: the call only reads the policy of a thread id; a thread that has gone returns
    // -1, which the assertions then report.
    unsafe { libc::sched_getscheduler(tid) }
}

/// Whether the kernel lets a thread of this process take SCHED_BATCH (a seccomp filter
/// may refuse; the loader then keeps the process's policy).
fn batch_allowed() -> bool {
    std::thread::spawn(|| {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a valid `sched_param` for the calling (throw-away) thread.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0 }
    })
    .join()
    .unwrap()
}

#[test]
fn gathering_threads_are_named_and_take_the_configured_policy() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    convert_all(&fixture(), "train", &out, &options(5, 2)).unwrap();
    let ds = Arc::new(Dataset::open(&out, ChecksumPolicy::Lazy).unwrap());
    let batch_allowed = batch_allowed();
    if !batch_allowed {
        eprintln!("SCHED_BATCH is refused here: checking the fallback (the process's policy)");
    }
    let workers = 3;
    for (scheduling, expected) in [
        (
            WorkerScheduling::Batch,
            if batch_allowed {
                libc::SCHED_BATCH
            } else {
                libc::SCHED_OTHER
            },
        ),
        (WorkerScheduling::Normal, libc::SCHED_OTHER),
    ] {
        let before = threads();
        let config = LoaderConfig {
            sampler: SamplerConfig {
                // One event per batch: far more batches than staging buffers, so with the
                // first batch held every worker is alive, waiting for a free buffer.
                batching: Batching::Events(1),
                ..SamplerConfig::default()
            },
            workers,
            device: DeviceChoice::Cpu,
            worker_scheduling: scheduling,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(ds.clone(), config, SamplerState::start(0)).unwrap();
        let held = loader.next().unwrap().unwrap();
        // The first gathering thread starts the others, and the waiting thread may have
        // gathered the first batch before it did: wait for them (at most 2 s).
        let started = within_2s(
            || -> BTreeMap<i32, String> {
                threads()
                    .into_iter()
                    .filter(|(tid, _)| !before.contains_key(tid))
                    .collect()
            },
            |started| started.len() >= workers && started.values().all(|n| n == GATHER_THREAD_NAME),
        );
        let names: Vec<&str> = started.values().map(String::as_str).collect();
        assert_eq!(names, vec![GATHER_THREAD_NAME; workers], "{scheduling:?}");
        for &tid in started.keys() {
            assert_eq!(policy(tid), expected, "{scheduling:?}: thread {tid}");
        }
        assert_eq!(
            policy(0),
            libc::SCHED_OTHER,
            "the consumer's thread changed"
        );
        drop(held);
        drop(loader);
        // Joined threads leave /proc a moment after the join returns (the kernel reaps
        // them after waking the joiner): wait for that, for at most 2 s.
        let left = within_2s(
            || -> Vec<i32> {
                threads()
                    .into_keys()
                    .filter(|tid| started.contains_key(tid))
                    .collect()
            },
            Vec::is_empty,
        );
        assert!(
            left.is_empty(),
            "{scheduling:?}: threads left running: {left:?}"
        );
    }
}
