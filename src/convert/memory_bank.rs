//! A counting semaphore over bytes: units of work take a lease of their estimated memory
//! and wait while the leases held would exceed the converter's working memory.
//!
//! A lease may carry its unit's scratch buffers, which are worth keeping for the next unit
//! (memory touched for the first time costs more than the work done in it). When the lease
//! ends, its scratch is parked in the bank with the lease's memory still counted, and the
//! next unit takes both over; a unit that has to wait frees any scratch it took, so a
//! parked scratch never holds memory that a waiting unit needs, and a waiting unit holds
//! nothing.

use std::sync::{Condvar, Mutex, MutexGuard};

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
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

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
