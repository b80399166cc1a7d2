//! How many threads gather at once.
//!
//! A loader with as many workers as cores, whose waiting thread gathers too
//! ([`super::LoaderConfig::consumer_gathers`]), would otherwise gather on one thread more
//! than it has cores: the kernel then shares two cores between three gathering threads,
//! and each thread's working set (prefetched lines, the sensor table, its staging buffer)
//! is evicted by the others' in turn. Every gather therefore holds a permit, and a loader
//! has as many as it has workers, or cores where it has more cores: the waiting thread
//! gathers in a worker's place (one blocked for a staging buffer or a permit), never beside
//! all of them. On the 2-core Zen 4 this delivered 1.2, 2.6, 3.3 and 3.0% more events a
//! second at windows 1, 4, 16 and 64, in either cache placement (docs/results.md,
//! "Gathering permits"). A user who sets more workers than cores (to overlap reads of a
//! cold page cache) keeps them all gathering.

use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::{bounded, Receiver, Sender};

use super::workers::free_now_or_blocked;

/// The permits of one loader: a channel holding the free ones.
pub(crate) struct GatherPermits {
    give: Sender<()>,
    take: Receiver<()>,
    count: usize,
    /// The most permits held at once so far.
    most_held: AtomicUsize,
}

/// A permit held: given back when dropped.
pub(crate) struct Permit<'p>(&'p GatherPermits);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        // Never full (a permit is only given back once taken), and the receiver lives as
        // long as the sender, in the same struct.
        let _ = self.0.give.try_send(());
    }
}

impl GatherPermits {
    /// `count` permits (at least 1), all free.
    pub(crate) fn new(count: usize) -> GatherPermits {
        let count = count.max(1);
        let (give, take) = bounded(count);
        for _ in 0..count {
            give.try_send(()).expect("room for every permit");
        }
        GatherPermits {
            give,
            take,
            count,
            most_held: AtomicUsize::new(0),
        }
    }

    /// The permits of a loader with `workers` workers on a machine of `cores` cores.
    pub(crate) fn for_loader(workers: usize, cores: usize) -> GatherPermits {
        GatherPermits::new(workers.max(cores))
    }

    /// How many there are.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// A permit and the seconds spent blocked for it, waiting for one to be given back
    /// when none is free (the clock is read only then); `None` once `stop` is signalled
    /// (its sender dropped) before one is.
    pub(crate) fn acquire(&self, stop: &Receiver<()>) -> Option<(Permit<'_>, f64)> {
        free_now_or_blocked(self.try_acquire(), &self.take, stop, |()| self.held())
    }

    /// A permit if one is free now.
    pub(crate) fn try_acquire(&self) -> Option<Permit<'_>> {
        self.take.try_recv().ok().map(|()| self.held())
    }

    /// The most permits held at once so far (counted as each was taken; a permit given
    /// back at that moment may make it one more than were really held together).
    pub(crate) fn most_held(&self) -> usize {
        self.most_held.load(Ordering::Relaxed)
    }

    fn held(&self) -> Permit<'_> {
        let held = self.count - self.take.len();
        // A load first: the line is written only when the figure rises (rarely).
        if held > self.most_held.load(Ordering::Relaxed) {
            self.most_held.fetch_max(held, Ordering::Relaxed);
        }
        Permit(self)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const PAUSE: Duration = Duration::from_millis(50);

    #[test]
    fn no_more_permits_are_held_than_there_are() {
        let permits = GatherPermits::new(2);
        let (_stop_tx, stop) = bounded::<()>(0);
        let (first, waited) = permits.acquire(&stop).expect("a free permit");
        assert_eq!(waited, 0.0, "a free permit is taken without waiting");
        let second = permits.try_acquire().expect("the other free permit");
        assert!(permits.try_acquire().is_none(), "a third permit out of two");
        assert_eq!(permits.most_held(), 2);
        drop(first);
        let third = permits.try_acquire().expect("the permit given back");
        assert!(permits.try_acquire().is_none());
        drop((second, third));
        assert_eq!(
            (permits.count(), permits.take.len()),
            (2, 2),
            "all given back"
        );
        assert_eq!(permits.most_held(), 2);
    }

    #[test]
    fn a_waiting_thread_gets_the_permit_given_back_or_gives_up_at_a_stop() {
        let permits = GatherPermits::new(1);
        let (stop_tx, stop) = bounded::<()>(0);
        let held = permits.try_acquire().unwrap();
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| permits.acquire(&stop).map(|(_, waited)| waited));
            std::thread::sleep(PAUSE);
            assert!(!waiter.is_finished(), "took a permit while none was free");
            drop(held);
            let waited = waiter.join().unwrap().expect("the permit given back");
            assert!(waited >= 0.9 * PAUSE.as_secs_f64(), "waited {waited} s");
        });
        let held = permits.try_acquire().expect("given back by the waiter");
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| permits.acquire(&stop).is_none());
            std::thread::sleep(PAUSE);
            drop(stop_tx);
            assert!(waiter.join().unwrap(), "gave up at the stop");
        });
        drop(held);
        assert_eq!(permits.take.len(), 1);
    }

    #[test]
    fn a_loader_has_a_permit_for_each_worker_or_each_core() {
        assert_eq!(GatherPermits::for_loader(2, 2).count(), 2);
        assert_eq!(GatherPermits::for_loader(1, 8).count(), 8);
        assert_eq!(GatherPermits::for_loader(8, 2).count(), 8);
        assert_eq!(GatherPermits::for_loader(0, 0).count(), 1);
    }
}
