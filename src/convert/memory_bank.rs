//! A counting semaphore over bytes: units of work take a lease of their estimated memory
//! and wait while the leases held would exceed the converter's working memory.

use std::sync::{Condvar, Mutex};

/// Admits units while their estimated memory fits the limit (one at a time when a single
/// unit is larger than the limit).
pub struct MemoryBank {
    free: Mutex<u64>,
    freed: Condvar,
    total: u64,
}

/// Memory taken from a [`MemoryBank`], given back when dropped.
pub struct Lease<'a> {
    bank: &'a MemoryBank,
    amount: u64,
}

impl MemoryBank {
    /// A bank of `total` bytes.
    pub fn new(total: u64) -> Self {
        MemoryBank {
            free: Mutex::new(total),
            freed: Condvar::new(),
            total,
        }
    }

    /// Waits until `amount` bytes (at most the whole bank) are free and takes them until
    /// the lease is dropped.
    pub fn acquire(&self, amount: u64) -> Lease<'_> {
        let amount = amount.min(self.total);
        let mut free = self.free.lock().expect("memory bank lock");
        while *free < amount {
            free = self.freed.wait(free).expect("memory bank lock");
        }
        *free -= amount;
        Lease { bank: self, amount }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        *self.bank.free.lock().expect("memory bank lock") += self.amount;
        self.bank.freed.notify_all();
    }
}
