//! The thread that waits for batches gathers too.
//!
//! When the next batch in order is not ready, the thread asking for it (the consumer's on
//! the CPU, the uploader's on a GPU) takes the epoch's next plan and gathers it itself,
//! instead of sleeping until a worker sends one. A loader with as many workers as cores
//! runs one thread more than it has cores: a consumer that blocks whenever the queue is
//! empty is woken on a core a worker needs, and the workers then block once the batches
//! ahead are all ready, which leaves cores idle while threads wake (measured on the 2-core
//! machine at window 16: 8-12% of both cores idle, the consumer preempted about 300 times
//! an epoch). A consumer that gathers while it would wait turns those gaps into batches.
//!
//! The workers own the epoch's plans and shard views (they borrow the dataset for the
//! epoch, inside a thread scope), so they lend them to the waiting thread for as long as
//! they run: [`Lending::lend_while`] publishes them, and takes them back before they go
//! out of scope, after any gather on loan has finished.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use super::permits::GatherPermits;
use super::plans::Plans;
use super::workers::{gather_plan, Filled, Stop};
use super::LoaderConfig;
use crate::batch::Gatherer;
use crate::device::staging::StagingPool;
use crate::error::Result;

/// What the workers lend: their plans, a gatherer of the waiting thread's own, and what a
/// gather needs.
pub(crate) struct Helper<'a> {
    pub(crate) plans: &'a Plans<'a>,
    /// Used by the waiting thread only (the lock is never contended).
    pub(crate) gatherer: Mutex<Gatherer<'a>>,
    pub(crate) config: &'a LoaderConfig,
    pub(crate) pool: &'a StagingPool,
    pub(crate) stop: &'a Stop,
}

/// A [`Helper`] on loan, its lifetime erased: valid while it is published in
/// [`Lending::lent`] (see [`Lending::lend_while`]).
struct LentHelper(NonNull<Helper<'static>>);

// SAFETY: a `LentHelper` is only dereferenced to a shared `&Helper`, and `Helper` is `Sync`
// (its plans, gatherer and counters sit behind locks and atomics), so sending the pointer to
// another thread or sharing it is as safe as sharing `&Helper`.
unsafe impl Send for LentHelper {}
// SAFETY: as above.
unsafe impl Sync for LentHelper {}

/// The hand-over point between the workers and the thread that waits for their batches.
pub(crate) struct Lending {
    /// The helper on loan, while the workers run.
    lent: RwLock<Option<LentHelper>>,
    /// Batches gathered by the waiting thread.
    gathered: AtomicU64,
    /// What every gather holds, the waiting thread's included.
    permits: GatherPermits,
}

impl Lending {
    /// Nothing on loan yet; gathers hold `permits`.
    pub(crate) fn new(permits: GatherPermits) -> Lending {
        Lending {
            lent: RwLock::new(None),
            gathered: AtomicU64::new(0),
            permits,
        }
    }

    /// The permits every gather holds.
    pub(crate) fn permits(&self) -> &GatherPermits {
        &self.permits
    }

    /// Lends `helper` to [`Lending::gather_next`] while `work` runs, and takes it back
    /// before returning (or unwinding), once no gather uses it any more.
    pub(crate) fn lend_while<R>(&self, helper: &Helper<'_>, work: impl FnOnce() -> R) -> R {
        /// Takes the helper back when dropped, so that a panic in `work` does too.
        struct Return<'l>(&'l Lending);
        impl Drop for Return<'_> {
            fn drop(&mut self) {
                // The write lock waits for a gather in progress, which holds a read lock.
                *self.0.lent.write().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        let erased = NonNull::from(helper).cast::<Helper<'static>>();
        *self.lent.write().unwrap_or_else(|e| e.into_inner()) = Some(LentHelper(erased));
        let _return = Return(self);
        work()
    }

    /// Gathers the epoch's next batch on the calling thread: `None` when nothing is on
    /// loan (the workers have not started or have finished), no staging buffer or no
    /// gathering permit is free, the plans have run out, or a stop was requested. Like a
    /// worker, it takes a buffer and a permit before a plan, so the oldest batch in flight
    /// always owns a buffer and is being gathered.
    pub(crate) fn gather_next(&self) -> Option<(u64, Result<Filled>)> {
        let lent = self.lent.read().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the pointer was made from a live `&Helper` in `lend_while`, which takes it
        // out of `lent` (under the write lock, so after this read lock is released) before
        // that borrow ends. While this guard is held the helper is therefore alive. Nothing
        // borrowed from it outlives the guard: a `Filled` owns its buffer and plan.
        let helper = unsafe { lent.as_ref()?.0.as_ref() };
        if helper.stop.requested() {
            return None;
        }
        let mut buffer = helper.pool.take_free()?;
        let permit = self.permits.try_acquire()?;
        let next = helper.plans.next_in(&mut buffer)?;
        let mut gatherer = helper.gatherer.lock().unwrap_or_else(|e| e.into_inner());
        let seq = next.seq;
        let filled = gather_plan(
            &mut gatherer,
            helper.config,
            helper.pool,
            helper.plans,
            buffer,
            next,
        )
        .map(|filled| Filled {
            gathered_while_waiting: true,
            ..filled
        });
        drop(permit);
        self.gathered.fetch_add(1, Ordering::Relaxed);
        Some((seq, filled))
    }

    /// Batches gathered by the waiting thread so far.
    pub(crate) fn gathered(&self) -> u64 {
        self.gathered.load(Ordering::Relaxed)
    }
}
