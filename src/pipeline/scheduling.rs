//! How the loader's gathering threads are scheduled beside the thread that consumes batches.
//!
//! A consumer that takes batches as fast as they come finds the pipeline full most of the
//! time, so each batch it drops frees a staging buffer that a sleeping worker waits for.
//! Under Linux's default policy the woken worker preempts the consumer on the spot (wake-up
//! preemption): with as many workers as cores (the default on the 2-core CI class), every
//! batch costs the consumer an involuntary context switch, and its thread (the training
//! loop) loses its core in the middle of its work. `SCHED_BATCH` tells the kernel the
//! gathering threads are throughput work: they get the same CPU share (same nice value),
//! but a woken worker waits for the next scheduling tick or a free core instead of
//! preempting. Measured on the 2-core machine, 320k events, window 16, 256 events per batch
//! (docs/results.md, "Worker scheduling"): the Rust loader 53 to 42 µs per batch, the
//! torch loader 63 to 44 µs, the consumer's involuntary switches from 1 per batch to 0.2.

use serde::{Deserialize, Serialize};

/// The name every gathering thread carries (`top -H`, `py-spy`, `/proc/PID/task/*/comm`).
pub const GATHER_THREAD_NAME: &str = "shardify-gather";

/// The name of the thread that queues a GPU loader's host-to-device copies.
pub const UPLOAD_THREAD_NAME: &str = "shardify-upload";

/// The scheduling policy of the loader's gathering threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerScheduling {
    /// Linux `SCHED_BATCH` (the default): same CPU share, no wake-up preemption of the
    /// consumer. Elsewhere, or where the kernel refuses (a seccomp filter), the threads
    /// keep the process's policy and a warning is logged once per process.
    #[default]
    Batch,
    /// The process's own policy, unchanged (inherited from the thread that made the
    /// loader): workers preempt the consumer when they wake.
    Normal,
}

impl std::str::FromStr for WorkerScheduling {
    type Err = crate::Error;

    fn from_str(name: &str) -> crate::Result<WorkerScheduling> {
        match name {
            "batch" => Ok(WorkerScheduling::Batch),
            "normal" => Ok(WorkerScheduling::Normal),
            other => Err(crate::Error::config(
                "worker_scheduling",
                format!("expected batch or normal, not {other:?}"),
            )),
        }
    }
}

impl WorkerScheduling {
    /// Its name, as [`str::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            WorkerScheduling::Batch => "batch",
            WorkerScheduling::Normal => "normal",
        }
    }

    /// Puts the calling thread under this policy. `Normal` changes nothing. An error says
    /// why `Batch` could not be set; the thread then runs on under its old policy.
    pub(crate) fn apply_to_current_thread(self) -> std::io::Result<()> {
        match self {
            WorkerScheduling::Normal => Ok(()),
            WorkerScheduling::Batch => set_batch_policy(),
        }
    }
}

#[cfg(target_os = "linux")]
fn set_batch_policy() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialised `sched_param` that outlives the call; pid 0
    // names the calling thread, and SCHED_BATCH with priority 0 needs no privilege.
    let status = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if status == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_batch_policy() -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "SCHED_BATCH exists on Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_ones_name_the_field() {
        for policy in [WorkerScheduling::Batch, WorkerScheduling::Normal] {
            assert_eq!(policy.name().parse::<WorkerScheduling>().unwrap(), policy);
        }
        let error = "fifo".parse::<WorkerScheduling>().unwrap_err().to_string();
        assert!(
            error.contains("worker_scheduling") && error.contains("\"fifo\""),
            "{error}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn batch_sets_the_calling_thread_only() {
        let (inside, outside) = std::thread::scope(|scope| {
            let inside = scope
                .spawn(|| {
                    let applied = WorkerScheduling::Batch.apply_to_current_thread();
                    // SAFETY: pid 0 names the calling thread; the call only reads.
                    (applied, unsafe { libc::sched_getscheduler(0) })
                })
                .join()
                .unwrap();
            // SAFETY: as above.
            (inside, unsafe { libc::sched_getscheduler(0) })
        });
        match inside {
            (Ok(()), policy) => assert_eq!(policy, libc::SCHED_BATCH),
            // A seccomp filter may refuse it: the thread must then be as it was.
            (Err(e), policy) => {
                eprintln!("SCHED_BATCH refused here ({e}): checking the thread kept its policy");
                assert_eq!(policy, libc::SCHED_OTHER);
            }
        }
        assert_eq!(outside, libc::SCHED_OTHER);
    }
}
