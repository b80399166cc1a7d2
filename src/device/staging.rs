//! Staging buffers: host memory that batches are gathered into, taken from a bounded pool
//! and returned when the consumer drops the batch, so the steady state allocates nothing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

/// Alignment of a staging buffer's start, in bytes.
pub const BUFFER_ALIGN: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; BUFFER_ALIGN]);

/// Memory a staging buffer can live in.
pub trait HostMemory: Send {
    /// The bytes (aligned to [`BUFFER_ALIGN`]).
    fn bytes_mut(&mut self) -> &mut [u8];
    /// The bytes, read-only.
    fn bytes(&self) -> &[u8];
    /// Whether the memory is page-locked (copies from it to a GPU are asynchronous).
    fn is_pinned(&self) -> bool {
        false
    }
}

/// Plain pageable memory, for the CPU path.
pub struct PlainMemory(Vec<Line>);

impl PlainMemory {
    /// At least `bytes` bytes, zeroed.
    pub fn new(bytes: usize) -> PlainMemory {
        PlainMemory(vec![Line([0; BUFFER_ALIGN]); bytes.div_ceil(BUFFER_ALIGN)])
    }
}

impl HostMemory for PlainMemory {
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `Line` is plain bytes with no padding (`repr(C)` of a byte array), so the
        // vector's storage is `len * 64` initialised bytes, borrowed mutably here.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.0.as_mut_ptr().cast::<u8>(),
                self.0.len() * BUFFER_ALIGN,
            )
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: as in `bytes_mut`, borrowed shared.
        unsafe {
            std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.0.len() * BUFFER_ALIGN)
        }
    }
}

/// Allocates host memory of at least the given size (plain or pinned).
pub type Allocator = Arc<dyn Fn(usize) -> Box<dyn HostMemory> + Send + Sync>;

/// A staging buffer out of the pool.
pub struct StagingBuffer {
    memory: Box<dyn HostMemory>,
}

impl StagingBuffer {
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        self.memory.bytes()
    }

    /// Its bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.memory.bytes_mut()
    }

    /// Whether the buffer is page-locked.
    pub fn is_pinned(&self) -> bool {
        self.memory.is_pinned()
    }
}

/// A pool of staging buffers: `base` of them, plus one for each batch the consumer holds
/// beyond [`CONSUMER_SLACK`] (so a consumer that keeps many batches never starves the
/// workers), given up again as those batches are dropped.
pub struct StagingPool {
    free: Receiver<StagingBuffer>,
    returns: Sender<StagingBuffer>,
    allocate: Allocator,
    allocations: AtomicU64,
    base: usize,
    initial_bytes: usize,
    existing: AtomicUsize,
    lent: AtomicUsize,
}

/// Batches a consumer may hold before the pool adds buffers for the workers.
pub const CONSUMER_SLACK: usize = 2;

impl StagingPool {
    /// A pool of `count` buffers of `initial_bytes` each.
    pub fn new(count: usize, initial_bytes: usize, allocate: Allocator) -> StagingPool {
        let (returns, free) = crossbeam_channel::unbounded();
        let initial_bytes = initial_bytes.max(BUFFER_ALIGN);
        let pool = StagingPool {
            free,
            returns,
            allocate,
            allocations: AtomicU64::new(0),
            base: count,
            initial_bytes,
            existing: AtomicUsize::new(count),
            lent: AtomicUsize::new(0),
        };
        for _ in 0..count {
            let memory = pool.allocate(initial_bytes);
            pool.returns
                .send(StagingBuffer { memory })
                .expect("the pool holds its receiver");
        }
        pool
    }

    /// Records that a buffer went to the consumer; adds a buffer when the consumer holds
    /// more than [`CONSUMER_SLACK`].
    pub fn lend(&self) {
        if self.lent.fetch_add(1, Ordering::AcqRel) + 1 > CONSUMER_SLACK {
            self.existing.fetch_add(1, Ordering::AcqRel);
            let memory = self.allocate(self.initial_bytes);
            let _ = self.returns.send(StagingBuffer { memory });
        }
    }

    /// Takes back a buffer the consumer had; surplus buffers are freed.
    pub fn return_lent(&self, buffer: StagingBuffer) {
        self.lent.fetch_sub(1, Ordering::AcqRel);
        let surplus = self
            .existing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > self.base).then(|| n - 1)
            })
            .is_ok();
        if !surplus {
            self.give_back(buffer);
        }
    }

    fn allocate(&self, bytes: usize) -> Box<dyn HostMemory> {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        (self.allocate)(bytes)
    }

    /// The channel free buffers come out of (for `select!` with a stop signal).
    pub fn free(&self) -> &Receiver<StagingBuffer> {
        &self.free
    }

    /// Puts back a buffer a worker had.
    pub fn give_back(&self, buffer: StagingBuffer) {
        let _ = self.returns.send(buffer);
    }

    /// Makes `buffer` hold at least `bytes`, growing it by a quarter more than asked so a
    /// slowly growing batch size does not reallocate every time.
    pub fn ensure_capacity(&self, buffer: &mut StagingBuffer, bytes: usize) {
        if buffer.bytes().len() < bytes {
            buffer.memory = self.allocate(bytes + bytes / 4);
        }
    }

    /// Buffers allocated since the pool was made (initial ones included).
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_reused_and_counted() {
        let pool = StagingPool::new(
            2,
            100,
            Arc::new(|n| Box::new(PlainMemory::new(n)) as Box<dyn HostMemory>),
        );
        assert_eq!(pool.allocations(), 2);
        let mut a = pool.free().recv().unwrap();
        assert_eq!(a.bytes().as_ptr() as usize % BUFFER_ALIGN, 0);
        assert!(a.bytes().len() >= 100);
        pool.ensure_capacity(&mut a, 50);
        assert_eq!(pool.allocations(), 2, "big enough: no allocation");
        pool.ensure_capacity(&mut a, 1000);
        assert_eq!(pool.allocations(), 3);
        pool.give_back(a);
        let b = pool.free().recv().unwrap();
        let c = pool.free().recv().unwrap();
        assert!(pool.free().try_recv().is_err(), "bounded: two buffers only");
        assert!(b.bytes().len() >= 1000 || c.bytes().len() >= 1000);
        for _ in 0..CONSUMER_SLACK {
            pool.lend();
        }
        assert!(
            pool.free().try_recv().is_err(),
            "a consumer within its slack adds nothing"
        );
        pool.lend();
        let d = pool
            .free()
            .try_recv()
            .expect("one more buffer for the workers");
        assert_eq!(pool.allocations(), 4);
        pool.return_lent(b);
        assert!(
            pool.free().try_recv().is_err(),
            "the surplus buffer is freed, not kept"
        );
        pool.return_lent(c);
        pool.return_lent(d);
        assert_eq!(pool.free().len(), 2, "back to the base size");
    }
}
