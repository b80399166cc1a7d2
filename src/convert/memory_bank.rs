//! A counting semaphore over bytes: units of work take a lease of their estimated memory
//! and wait while the leases held would exceed the converter's working memory.
//!
//! A lease may carry its unit's scratch buffers, which are worth keeping for the next unit
//! (memory touched for the first time costs more than the work done in it). When the lease
//! ends, its scratch is parked in the bank with the lease's memory still counted, and the
//! next unit takes both over; a unit that has to wait frees any scratch it took, so a
//! parked scratch never holds memory that a waiting unit needs, and a waiting unit holds
//! nothing.
//!
//! Units that wait on a bank run through [`for_each_unit`], never a parallel iterator: see
//! there.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Runs `run` on every item of `units` on the current rayon pool's threads, each thread
/// taking the next unit once it has finished its last, and returns the first error (the
/// units not started by then are left).
///
/// Not a parallel iterator: a unit waits for memory in [`MemoryBank::acquire`], and a rayon
/// thread that waits inside a unit's own parallel work (a bucket's sort, its packing
/// parts) runs other jobs meanwhile, a parallel iterator's next units among them. A unit
/// started so, beneath one that holds memory on the same thread, may wait for that memory
/// for ever: `shardify convert --threads 16 --memory-limit 256MiB` over 1M events hung so
/// in its gather, every thread waiting for memory and two of them beneath a unit that held
/// it. Here each thread's loop is a broadcast job, which only that thread ever takes, so a
/// unit's waits find only other units' inner work, and a unit never starts beneath another.
pub fn for_each_unit<T: Sync>(units: &[T], run: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    rayon::broadcast(|_| {
        while !stop.load(Ordering::Relaxed) {
            let Some(unit) = units.get(next.fetch_add(1, Ordering::Relaxed)) else {
                return;
            };
            if let Err(error) = run(unit) {
                stop.store(true, Ordering::Relaxed);
                failed
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .get_or_insert(error);
            }
        }
    });
    failed
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .map_or(Ok(()), Err)
}

/// Admits units while their estimated memory fits the limit (one at a time when a single
/// unit is larger than the limit), with at most one parked scratch of type `S`.
pub struct MemoryBank<S = ()> {
    state: Mutex<State<S>>,
    freed: Condvar,
    total: u64,
}

struct State<S> {
    free: u64,
    /// A scratch left by an ended lease, and the memory still counted for it.
    parked: Option<(S, u64)>,
}

/// Memory taken from a [`MemoryBank`], given back (or parked with its scratch) when dropped.
pub struct Lease<'a, S = ()> {
    bank: &'a MemoryBank<S>,
    amount: u64,
    scratch: Option<S>,
}

impl<S> MemoryBank<S> {
    /// A bank of `total` bytes (at least one: in an empty bank every lease would be
    /// empty, and every unit would run at once).
    pub fn new(total: u64) -> Self {
        let total = total.max(1);
        MemoryBank {
            state: Mutex::new(State {
                free: total,
                parked: None,
            }),
            freed: Condvar::new(),
            total,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<S>> {
        self.state.lock().expect("memory bank lock")
    }

    /// Waits until `amount` bytes (at most the whole bank) are free and takes them until
    /// the lease is dropped, with the parked scratch if there is one.
    pub fn acquire(&self, amount: u64) -> Lease<'_, S> {
        let amount = amount.min(self.total);
        let mut state = self.lock();
        let mut scratch = None;
        loop {
            if let Some((parked, counted)) = state.parked.take() {
                state.free += counted;
                // A second parked scratch (one parked while this unit waited) is freed.
                scratch.get_or_insert(parked);
            }
            if state.free >= amount {
                state.free -= amount;
                return Lease {
                    bank: self,
                    amount,
                    scratch,
                };
            }
            // Its memory is no longer counted: a waiting unit holds nothing.
            scratch = None;
            state = self.freed.wait(state).expect("memory bank lock");
        }
    }
}

impl<S: Default> Lease<'_, S> {
    /// The lease's scratch: the one it took over, or a new one. Taken over from a larger
    /// unit, it may hold more than this lease counts, until it is freed or resized.
    pub fn scratch(&mut self) -> &mut S {
        self.scratch.get_or_insert_with(S::default)
    }
}

impl<S> Drop for Lease<'_, S> {
    fn drop(&mut self) {
        let mut state = self.bank.lock();
        let freed = match self.scratch.take() {
            Some(scratch) if state.parked.is_none() => {
                state.parked = Some((scratch, self.amount));
                None
            }
            other => {
                state.free += self.amount;
                other
            }
        };
        drop(state);
        drop(freed);
        self.bank.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::cell::Cell;
    use std::sync::atomic::AtomicU64;
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    thread_local! {
        /// Units running on this thread, one beneath another.
        static UNITS_HERE: Cell<usize> = const { Cell::new(0) };
    }

    /// A unit with inner parallel work of uneven length, as a bucket's sort and packing
    /// parts: its waits let a rayon thread run other jobs.
    fn unit_with_inner_work(unit: usize, started_beneath_another: &AtomicUsize) {
        if UNITS_HERE.with(|here| here.replace(here.get() + 1)) > 0 {
            started_beneath_another.fetch_add(1, Ordering::SeqCst);
        }
        let mut keys: Vec<u64> = (0..3000 + (unit as u64 * 7919) % 20_000)
            .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        keys.par_sort_unstable();
        keys.par_chunks(keys.len().div_ceil(2)).for_each(|part| {
            std::thread::sleep(Duration::from_micros((unit + part.len()) as u64 % 7 * 300));
        });
        UNITS_HERE.with(|here| here.set(here.get() - 1));
    }

    /// A rayon pool of `threads` threads.
    fn pool_of(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn a_unit_never_starts_beneath_another_on_the_same_thread() {
        // The same units as a parallel iterator started 116-312 of 2,000 beneath another
        // unit with 4, 8 and 16 threads (none with 2 or 3); a unit that then waits for
        // memory the one beneath it holds waits for ever.
        let pool = pool_of(8);
        let units: Vec<usize> = (0..600).collect();
        let (beneath, ran) = (AtomicUsize::new(0), AtomicUsize::new(0));
        pool.install(|| {
            for_each_unit(&units, |&unit| {
                unit_with_inner_work(unit, &beneath);
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        })
        .unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), units.len(), "every unit once");
        assert_eq!(beneath.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_first_failed_unit_ends_the_run() {
        let pool = pool_of(4);
        let units: Vec<u64> = (0..1000).collect();
        let ran = AtomicUsize::new(0);
        let result = pool.install(|| {
            for_each_unit(&units, |&unit| {
                ran.fetch_add(1, Ordering::SeqCst);
                if unit == 10 {
                    return Err(Error::config("unit", "unit 10 failed"));
                }
                std::thread::sleep(Duration::from_millis(1));
                Ok(())
            })
        });
        assert!(
            matches!(&result, Err(Error::Config { problem, .. }) if problem == "unit 10 failed"),
            "{result:?}"
        );
        // Each thread finishes the unit it is in, then takes no other.
        let ran = ran.load(Ordering::SeqCst);
        assert!((11..=11 + 4).contains(&ran), "{ran} units ran");
    }

    #[test]
    fn a_parked_scratch_is_taken_over_with_its_memory() {
        let bank: MemoryBank<Vec<u8>> = MemoryBank::new(100);
        let mut first = bank.acquire(60);
        first.scratch().extend_from_slice(b"kept");
        drop(first);
        // Parked: its 60 bytes still counted.
        assert_eq!(bank.lock().free, 40);
        let mut second = bank.acquire(70);
        assert_eq!(second.scratch().as_slice(), b"kept");
        assert_eq!(bank.lock().free, 30);
        drop(second);
        assert_eq!(bank.lock().parked.as_ref().map(|p| p.1), Some(70));
    }

    #[test]
    fn a_parked_scratch_never_blocks_a_waiting_unit() {
        // One unit at a time: the second waits while the first runs, then the first ends
        // and parks its scratch with its memory. The waiting unit must take it over; had
        // it checked for a parked scratch only before waiting, it would wait for ever.
        let bank: Arc<MemoryBank<Vec<u8>>> = Arc::new(MemoryBank::new(10));
        let mut first = bank.acquire(8);
        first.scratch().push(7);
        let (sent, got) = mpsc::channel();
        let waiting = Arc::clone(&bank);
        std::thread::spawn(move || {
            let mut second = waiting.acquire(8);
            sent.send(second.scratch().clone()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            got.try_recv().is_err(),
            "the second unit ran beside the first"
        );
        drop(first);
        let scratch = got
            .recv_timeout(Duration::from_secs(10))
            .expect("the waiting unit never got the parked scratch's memory");
        assert_eq!(scratch, vec![7]);
    }

    #[test]
    fn leases_never_exceed_the_bank() {
        let bank: MemoryBank = MemoryBank::new(100);
        let held = AtomicU64::new(0);
        let most = AtomicU64::new(0);
        std::thread::scope(|s| {
            for amount in [30, 40, 50, 60] {
                let (bank, held, most) = (&bank, &held, &most);
                s.spawn(move || {
                    for _ in 0..50 {
                        let _lease = bank.acquire(amount);
                        let now = held.fetch_add(amount, Ordering::SeqCst) + amount;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_micros(50));
                        held.fetch_sub(amount, Ordering::SeqCst);
                    }
                });
            }
        });
        let most = most.load(Ordering::SeqCst);
        assert!((60..=100).contains(&most), "{most}");
    }
}
