//! Values that belong to the process that made them.
//!
//! After `fork` (a torch `DataLoader` worker, `multiprocessing` with the fork start
//! method) the child has copies of the parent's Rust objects but none of its threads, and
//! mutexes another thread held at the fork stay locked forever. A loader used there would
//! wait for workers that do not exist; dropping it would join them. So the child may
//! neither use nor drop such a value: it gets a clear error, and the copy is leaked.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

/// This process's id, kept by a `pthread_atfork` handler: `getpid` is a system call, 0.5 µs
/// on these virtual machines, and a batch handed to Python checks its process once per
/// section; reading this is a load.
static PROCESS_ID: AtomicU32 = AtomicU32::new(0);
static TRACK_FORKS: Once = Once::new();

/// Runs in the child of every `fork`, before `fork` returns there.
extern "C" fn record_child_id() {
    PROCESS_ID.store(std::process::id(), Ordering::Relaxed);
}

/// The current process's id (the child's own after a fork).
fn current_process() -> u32 {
    TRACK_FORKS.call_once(|| {
        PROCESS_ID.store(std::process::id(), Ordering::Relaxed);
        // SAFETY: registers a handler that only stores getpid's result in an atomic, which
        // is async-signal-safe and valid in a freshly forked child.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(record_child_id)) };
        assert_eq!(rc, 0, "pthread_atfork failed");
    });
    PROCESS_ID.load(Ordering::Relaxed)
}

/// A value usable, and dropped, only in the process that created it.
pub struct ProcessBound<T> {
    value: ManuallyDrop<T>,
    owner: u32,
}

impl<T> ProcessBound<T> {
    /// Binds `value` to the current process.
    pub fn new(value: T) -> Self {
        ProcessBound {
            value: ManuallyDrop::new(value),
            owner: current_process(),
        }
    }

    /// The value, or the error to show in a forked child.
    pub fn get(&self) -> Result<&T, Forked> {
        self.check()?;
        Ok(&self.value)
    }

    /// The value mutably, or the error to show in a forked child.
    pub fn get_mut(&mut self) -> Result<&mut T, Forked> {
        self.check()?;
        Ok(&mut self.value)
    }

    fn check(&self) -> Result<(), Forked> {
        // Kept current across forks by the atfork handler.
        let current = current_process();
        if current == self.owner {
            Ok(())
        } else {
            Err(Forked {
                owner: self.owner,
                current,
            })
        }
    }
}

impl<T> Drop for ProcessBound<T> {
    fn drop(&mut self) {
        if self.check().is_ok() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.value) };
        }
        // In a forked child the value's threads and locks belong to the parent: leak it.
    }
}

/// A process-bound value was used after a fork.
#[derive(Debug)]
pub struct Forked {
    /// The process that created it.
    pub owner: u32,
    /// The process that tried to use it.
    pub current: u32,
}

impl std::fmt::Display for Forked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this shardify loader was created in process {} and cannot be used in process {} \
             (a fork, e.g. a torch DataLoader worker): its worker threads stayed in the \
             parent. Iterate the shardify.Loader directly in the training process (it runs \
             its own worker threads; no DataLoader is needed), or create it inside the child",
            self.owner, self.current
        )
    }
}
