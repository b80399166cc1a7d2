//! Staging buffers: host memory that batches are gathered into, taken from a bounded pool
//! and returned when the consumer drops the batch, so the steady state allocates nothing.
//!
//! A buffer goes back to its pool whenever it is dropped (a batch dropped, a plan that
//! failed, a loader stopped with batches in flight), so a pool outlives the loaders that
//! use it: the Python package's loader keeps one pool across epochs and seeks. A buffer
//! whose pool is gone is freed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::batch::Sections;
use crate::cores::OwnLines;
use crate::format::pod::{LineAligned, CACHE_LINE};
use crate::sampler::EventRef;

/// Alignment of a staging buffer's start, in bytes.
pub const BUFFER_ALIGN: usize = CACHE_LINE;

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
pub struct PlainMemory(Storage);

enum Storage {
    /// Small buffers, from the allocator.
    Lines(LineAligned),
    /// Large ones, mapped from the kernel and unmapped when dropped: the allocator would keep
    /// them in the heap of the (worker) thread that freed them, where, buffer after buffer
    /// and loader after loader, they fragment memory that RSS then counts (measured: +20 MiB
    /// swings over 200 short-lived loaders on 320k real-profile events, +0.1 MiB mapped).
    /// The buffer is `len` bytes from `start`, a huge-page boundary (see [`map_buffer`]).
    Mapped {
        map: memmap2::MmapMut,
        start: usize,
        len: usize,
    },
}

/// Buffers from this size on are mapped (see [`Storage::Mapped`]).
const MAP_FROM_BYTES: usize = 256 << 10;

/// A transparent huge page on x86-64 (and on arm64 with 4 KiB pages).
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

impl PlainMemory {
    /// At least `bytes` bytes, zeroed.
    pub fn new(bytes: usize) -> PlainMemory {
        if bytes >= MAP_FROM_BYTES {
            if let Some(storage) = map_buffer(bytes) {
                return PlainMemory(storage);
            }
        }
        PlainMemory(Storage::Lines(LineAligned::zeroed(bytes)))
    }
}

/// `bytes` of anonymous memory, zeroed by the kernel, starting on a huge-page boundary
/// (hence aligned to [`BUFFER_ALIGN`]), its whole huge pages asked for in huge pages
/// (`MADV_HUGEPAGE`; the tail beyond the last one stays in small pages, so nothing is
/// allocated beyond `bytes`): a batch is written at scattered places of a buffer several
/// MiB large, one buffer after another of the pool, and one TLB entry per 2 MiB instead of
/// per 4 KiB made the loader 2-8% faster at windows 4 and 16 (docs/results.md, "Staging
/// buffers in huge pages"). Populated at once: the pages are resident from the start (what
/// RSS shows is what the pool holds, not what its largest batch so far touched), faulted in
/// by the kernel in one go rather than one page at a time by the first gathers. The
/// mapping is one huge page longer than `bytes`, to find the boundary in; that page of
/// address space is never touched. `None` when the kernel maps nothing.
fn map_buffer(bytes: usize) -> Option<Storage> {
    let huge = bytes / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    let slack = if huge > 0 { HUGE_PAGE_BYTES } else { 0 };
    let mut map = memmap2::MmapOptions::new()
        .len(bytes + slack)
        .map_anon()
        .ok()?;
    let mut start = 0;
    if huge > 0 {
        let address = map.as_ptr() as usize;
        start = address.next_multiple_of(HUGE_PAGE_BYTES) - address;
        if let Err(e) = map.advise_range(memmap2::Advice::HugePage, start, huge) {
            // A hint: kernels without transparent huge pages refuse it.
            tracing::debug!("staging buffer of {bytes} bytes: no huge pages ({e})");
        }
    }
    if map
        .advise_range(memmap2::Advice::PopulateWrite, start, bytes)
        .is_err()
    {
        // Kernels before 5.14: a write to each page faults it in (zero stays zero).
        let page = crate::dataset::page_size();
        for at in (start..start + bytes).step_by(page) {
            map[at] = 0;
        }
    }
    Some(Storage::Mapped {
        map,
        start,
        len: bytes,
    })
}

impl HostMemory for PlainMemory {
    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Storage::Lines(lines) => lines.bytes_mut(),
            Storage::Mapped { map, start, len } => &mut map[*start..*start + *len],
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.0 {
            Storage::Lines(lines) => lines.bytes(),
            Storage::Mapped { map, start, len } => &map[*start..*start + *len],
        }
    }
}

/// Allocates host memory of at least the given size (plain or pinned).
pub type Allocator = Arc<dyn Fn(usize) -> Box<dyn HostMemory> + Send + Sync>;

/// The CPU path's allocator: plain pageable memory ([`PlainMemory`]).
pub fn plain_allocator() -> Allocator {
    Arc::new(|n| Box::new(PlainMemory::new(n)) as Box<dyn HostMemory>)
}

/// The vectors that describe a batch beside its bytes: its plan's events and its section
/// table. They travel with the staging buffer: the consumer's batch puts them back in it
/// when dropped, and the next gather into the buffer refills them. So the thread that
/// plans and gathers reuses memory instead of allocating, and no thread frees memory
/// another thread allocated (each such free moves the allocator's own cache lines between
/// cores, which costs the most where the two share no cache).
#[derive(Debug, Default)]
pub struct BatchVectors {
    /// A plan's events (any content: planning empties it).
    pub events: Vec<EventRef>,
    /// A section table (any content: planning replaces it).
    pub sections: Sections,
}

/// A staging buffer out of the pool; dropped, it goes back there.
pub struct StagingBuffer {
    /// `None` only while it is being freed for good.
    memory: Option<Box<dyn HostMemory>>,
    home: Sender<StagingBuffer>,
    /// The CPU its last batch was gathered on, where its lines are most likely still
    /// cached ([`StagingPool::take_free`]).
    gathered_on: Option<u32>,
    /// The vectors of the batch it last held, kept for the next.
    vectors: BatchVectors,
}

impl Drop for StagingBuffer {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            let back = StagingBuffer {
                memory: Some(memory),
                home: self.home.clone(),
                gathered_on: self.gathered_on,
                vectors: std::mem::take(&mut self.vectors),
            };
            if let Err(crossbeam_channel::SendError(mut orphan)) = self.home.send(back) {
                // The pool is gone: free the memory (and do not try to send it again).
                orphan.memory = None;
            }
        }
    }
}

impl StagingBuffer {
    fn memory(&self) -> &dyn HostMemory {
        self.memory
            .as_deref()
            .expect("memory is taken only in drop and discard")
    }

    /// Frees the buffer instead of returning it to its pool.
    fn discard(mut self) {
        self.memory = None;
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        self.memory().bytes()
    }

    /// Its bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.memory
            .as_deref_mut()
            .expect("memory is taken only in drop and discard")
            .bytes_mut()
    }

    /// Whether the buffer is page-locked.
    pub fn is_pinned(&self) -> bool {
        self.memory().is_pinned()
    }

    /// The CPU its last batch was gathered on (`None` before its first, or where the
    /// system does not say).
    pub fn gathered_on(&self) -> Option<u32> {
        self.gathered_on
    }

    /// Records that a batch was just gathered into it on the calling thread's CPU.
    pub fn mark_gathered_here(&mut self) {
        self.gathered_on = crate::cores::current_cpu();
    }

    /// The vectors kept for its next batch (empty ones the first time), taken out.
    pub fn take_vectors(&mut self) -> BatchVectors {
        std::mem::take(&mut self.vectors)
    }

    /// Keeps the vectors of a batch it held for the next batch gathered into it.
    pub fn keep_vectors(&mut self, vectors: BatchVectors) {
        self.vectors = vectors;
    }
}

/// A pool of staging buffers: `base` of them, plus one for each batch the consumer holds
/// beyond [`CONSUMER_SLACK`] (so a consumer that keeps many batches never starves the
/// workers), given up again once the consumer has held fewer for [`HOLDING_WINDOW`] to
/// twice that many batches. A consumer whose holding rises and falls (a batch kept aside
/// while the loop holds the previous one, batches gathered for an accumulated step) thus
/// reuses its buffers instead of allocating one and freeing another per batch.
pub struct StagingPool {
    /// What the gathering threads read for every batch.
    gathering: OwnLines<Gathering>,
    /// The consumer's holding, written for every batch it takes and drops: on lines of its
    /// own, so those writes do not take the lines the gathering threads read away from
    /// their cores (nor do the counts of the `Arc` the consumer's batches hold, which sit
    /// on the lines before the pool).
    holding: OwnLines<Holding>,
}

/// The part of a [`StagingPool`] the gathering threads read for every batch.
struct Gathering {
    free: Receiver<StagingBuffer>,
    returns: Sender<StagingBuffer>,
    allocate: Allocator,
    allocations: AtomicU64,
    base: usize,
    /// The largest size a buffer of the pool was grown to: a buffer that must grow takes at
    /// least this, so the pool converges on its largest batches in a few steps.
    high_water: AtomicUsize,
}

/// The part of a [`StagingPool`] the consumer writes for every batch.
struct Holding {
    existing: AtomicUsize,
    lent: AtomicUsize,
    /// Batches lent so far (to count the windows).
    lends: AtomicUsize,
    /// The most buffers the consumer's holding needed in this window of lends, and in the
    /// window before.
    peak: AtomicUsize,
    last_peak: AtomicUsize,
}

/// The most free buffers [`StagingPool::take_free`] looks at for one of the caller's CPU:
/// each look takes a buffer out of the pool's channel and puts it back (about 45 ns on the
/// 2-core Zen 5), so a pool of many free buffers (many workers, a fast consumer) costs a
/// gathering thread at most about 0.4 µs a batch. With two CPUs the first or second look
/// finds one in most takes.
pub const FREE_BUFFERS_LOOKED_AT: usize = 8;

/// Batches a consumer may hold before the pool adds buffers for the workers.
pub const CONSUMER_SLACK: usize = 2;

/// Batches over which the pool remembers the consumer's largest holding: buffers added for
/// a holding are kept while one as large came in this window or the one before.
pub const HOLDING_WINDOW: usize = 64;

impl StagingPool {
    /// A pool of `count` buffers of `initial_bytes` each.
    pub fn new(count: usize, initial_bytes: usize, allocate: Allocator) -> StagingPool {
        let (returns, free) = crossbeam_channel::unbounded();
        let initial_bytes = initial_bytes.max(BUFFER_ALIGN);
        let pool = StagingPool {
            gathering: OwnLines(Gathering {
                free,
                returns,
                allocate,
                allocations: AtomicU64::new(0),
                base: count,
                high_water: AtomicUsize::new(initial_bytes),
            }),
            holding: OwnLines(Holding {
                existing: AtomicUsize::new(count),
                lent: AtomicUsize::new(0),
                lends: AtomicUsize::new(0),
                peak: AtomicUsize::new(count),
                last_peak: AtomicUsize::new(count),
            }),
        };
        for _ in 0..count {
            pool.add(initial_bytes);
        }
        pool
    }

    /// A new buffer of `bytes`, into the free ones.
    fn add(&self, bytes: usize) {
        drop(self.wrap(self.allocate(bytes)));
    }

    fn wrap(&self, memory: Box<dyn HostMemory>) -> StagingBuffer {
        StagingBuffer {
            memory: Some(memory),
            home: self.gathering.returns.clone(),
            gathered_on: None,
            vectors: BatchVectors::default(),
        }
    }

    /// The buffers a consumer holding `lent` batches needs: the base ones, and one for each
    /// batch beyond [`CONSUMER_SLACK`].
    fn needed(&self, lent: usize) -> usize {
        self.gathering.base + lent.saturating_sub(CONSUMER_SLACK)
    }

    /// Records that a buffer went to the consumer; adds a buffer when the consumer holds
    /// more than [`CONSUMER_SLACK`] and the buffers there are do not cover that already.
    pub fn lend(&self) {
        let needed = self.needed(self.holding.lent.fetch_add(1, Ordering::AcqRel) + 1);
        self.holding.peak.fetch_max(needed, Ordering::AcqRel);
        if (self.holding.lends.fetch_add(1, Ordering::AcqRel) + 1).is_multiple_of(HOLDING_WINDOW) {
            // A new window: the one ending becomes the one before.
            let ending = self.holding.peak.swap(needed, Ordering::AcqRel);
            self.holding.last_peak.store(ending, Ordering::Release);
        }
        let grow = self
            .holding
            .existing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < needed).then_some(n + 1)
            })
            .is_ok();
        if grow {
            self.add(self.gathering.high_water.load(Ordering::Acquire));
        }
    }

    /// Takes back a buffer the consumer had; it is freed when the pool holds more buffers
    /// than the consumer's holding needs now or needed at its largest in this window of
    /// [`HOLDING_WINDOW`] lends or the one before.
    pub fn return_lent(&self, buffer: StagingBuffer) {
        let now = self.needed(self.holding.lent.fetch_sub(1, Ordering::AcqRel) - 1);
        let kept = now
            .max(self.holding.peak.load(Ordering::Acquire))
            .max(self.holding.last_peak.load(Ordering::Acquire));
        let surplus = self
            .holding
            .existing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > kept).then(|| n - 1)
            })
            .is_ok();
        if surplus {
            buffer.discard();
        }
        // Otherwise it goes back as it drops.
    }

    fn allocate(&self, bytes: usize) -> Box<dyn HostMemory> {
        self.gathering.allocations.fetch_add(1, Ordering::Relaxed);
        (self.gathering.allocate)(bytes)
    }

    /// A free buffer, without waiting (`None` when none is free): one whose last batch was
    /// gathered on the calling thread's CPU when there is one, else the one freed longest
    /// ago. A batch's lines stay in the caches of the core that wrote them (no consumer
    /// that only hands the batch on reads them there); where two cores share no cache (a
    /// virtual machine's two vCPUs on two of the host's core complexes), writing a buffer
    /// that the other core filled last pulls every line across first, slower than from
    /// memory: there the loader delivered 16-19% more events a second at windows 4-64 than
    /// when any thread took the oldest buffer, and the same where the cores share their L3
    /// (2-core Zen 5 VM; docs/results.md, "Staging buffers back to the core that filled
    /// them").
    pub fn take_free(&self) -> Option<StagingBuffer> {
        self.take_free_for(crate::cores::current_cpu())
    }

    /// [`StagingPool::take_free`] for a thread on `cpu`. Looks at the buffers free now in
    /// the order they were freed, at most [`FREE_BUFFERS_LOOKED_AT`] of them (those passed
    /// over go back behind the others).
    fn take_free_for(&self, cpu: Option<u32>) -> Option<StagingBuffer> {
        let Some(cpu) = cpu else {
            return self.gathering.free.try_recv().ok();
        };
        let mut oldest = None;
        for _ in 0..self.gathering.free.len().min(FREE_BUFFERS_LOOKED_AT) {
            let Ok(buffer) = self.gathering.free.try_recv() else {
                break;
            };
            if buffer.gathered_on == Some(cpu) {
                return Some(buffer);
            }
            if oldest.is_none() {
                oldest = Some(buffer);
            }
            // Any other goes back as it drops.
        }
        oldest.or_else(|| self.gathering.free.try_recv().ok())
    }

    /// The channel free buffers come out of (for `select!` with a stop signal).
    pub fn free(&self) -> &Receiver<StagingBuffer> {
        &self.gathering.free
    }

    /// Makes `buffer` hold at least `bytes`, and at least the pool's high-water mark: a
    /// buffer that must grow takes twice what is asked, and every buffer of the pool follows
    /// it to that size the next time it is used. Heavy-tailed batch sizes (the real data's
    /// largest events hold 3,000 times the median's pulses; an epoch's largest 256-event
    /// batch varied from 2.6 to 4.2 MiB over 10 epochs of 320k events) then cost the pool
    /// its reallocations in the first epoch, and a job running for weeks stops allocating
    /// unless a batch comes twice as large as any before.
    pub fn ensure_capacity(&self, buffer: &mut StagingBuffer, bytes: usize) {
        let high = self.gathering.high_water.load(Ordering::Acquire);
        let len = buffer.bytes().len();
        if len < bytes || len < high {
            let grown = if len < bytes {
                (2 * bytes).max(high)
            } else {
                high
            };
            self.gathering.high_water.fetch_max(grown, Ordering::AcqRel);
            buffer.memory = Some(self.allocate(grown));
        }
    }

    /// Grows every free buffer to hold at least `bytes` now, as
    /// [`StagingPool::ensure_capacity`] would at its next use (buffers out with a consumer
    /// follow the high-water mark when they are next used): a caller that knows its largest
    /// batch ahead pays for the growth before a phase it times.
    pub fn reserve(&self, bytes: usize) {
        let mut taken = Vec::new();
        while let Ok(mut buffer) = self.gathering.free.try_recv() {
            self.ensure_capacity(&mut buffer, bytes);
            taken.push(buffer);
        }
        // Dropped, they go back to the pool.
    }

    /// Buffers allocated since the pool was made (initial ones included).
    pub fn allocations(&self) -> u64 {
        self.gathering.allocations.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `base` buffers of 100 bytes in plain memory.
    fn plain_pool(base: usize) -> StagingPool {
        StagingPool::new(base, 100, plain_allocator())
    }

    /// A pool of `base` buffers of `initial_bytes`, and the count of its buffers alive.
    fn counted_pool(base: usize, initial_bytes: usize) -> (StagingPool, Arc<AtomicUsize>) {
        let alive = Arc::new(AtomicUsize::new(0));
        let counter = alive.clone();
        let allocate: Allocator = Arc::new(move |n| {
            counter.fetch_add(1, Ordering::SeqCst);
            Box::new(Counted(PlainMemory::new(n), counter.clone())) as Box<dyn HostMemory>
        });
        (StagingPool::new(base, initial_bytes, allocate), alive)
    }

    #[test]
    fn buffers_are_aligned_reused_and_counted() {
        let pool = plain_pool(2);
        assert_eq!(pool.allocations(), 2);
        let mut a = pool.free().recv().unwrap();
        assert_eq!(a.bytes().as_ptr() as usize % BUFFER_ALIGN, 0);
        assert!(a.bytes().len() >= 100);
        pool.ensure_capacity(&mut a, 50);
        assert_eq!(pool.allocations(), 2, "big enough: no allocation");
        pool.ensure_capacity(&mut a, 1000);
        assert_eq!(pool.allocations(), 3);
        assert!(a.bytes().len() >= 2000, "grown to twice the batch");
        drop(a); // back to the pool
        let mut b = pool.free().recv().unwrap();
        let mut c = pool.free().recv().unwrap();
        assert!(pool.free().try_recv().is_err(), "bounded: two buffers only");
        assert!(b.bytes().len() >= 2000 || c.bytes().len() >= 2000);
        // The other buffer follows the high-water mark on its next use, whatever it holds.
        pool.ensure_capacity(&mut b, 10);
        pool.ensure_capacity(&mut c, 10);
        assert!(b.bytes().len() >= 2000 && c.bytes().len() >= 2000);
        assert_eq!(
            pool.allocations(),
            4,
            "one buffer grew, then the other followed once"
        );
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
        assert_eq!(pool.allocations(), 5);
        assert!(
            d.bytes().len() >= 2000,
            "a buffer added later starts at the high water"
        );
        pool.return_lent(b);
        pool.return_lent(c);
        pool.return_lent(d);
        assert_eq!(
            pool.free().len(),
            3,
            "the added buffer is kept: the holding that needed it is recent"
        );
        assert_eq!(pool.allocations(), 5);
    }

    /// The consumer takes a batch: a buffer goes out of the pool to it.
    fn lend_one(pool: &StagingPool) -> StagingBuffer {
        pool.lend();
        pool.free().try_recv().expect("a free buffer for the batch")
    }

    #[test]
    fn a_consumer_keeping_batches_aside_allocates_once_not_per_batch() {
        for aside in 1..=4 {
            let pool = plain_pool(3);
            // Batches kept for good (a sample to log, say), then a loop that holds the
            // previous batch while it takes the next, as `for batch in loader` does.
            let kept: Vec<_> = (0..aside).map(|_| lend_one(&pool)).collect();
            let mut previous = lend_one(&pool);
            let before = pool.allocations();
            let mut added = Vec::new();
            for _ in 0..100 {
                let next = lend_one(&pool);
                pool.return_lent(std::mem::replace(&mut previous, next));
                added.push(pool.allocations() - before);
            }
            assert!(
                added.iter().all(|&n| n == added[0]) && added[0] <= 1,
                "{aside} kept aside: at most one buffer added, at the first batch: {added:?}"
            );
            assert_eq!(
                pool.holding.existing.load(Ordering::Acquire),
                3 + (aside + 2usize).saturating_sub(CONSUMER_SLACK),
                "{aside} kept aside: one buffer per batch held beyond the slack"
            );
            drop(kept);
        }
    }

    #[test]
    fn a_holding_that_rises_and_falls_reuses_its_buffers() {
        // Batches gathered for an accumulated step: 8 held, then all dropped, 20 times.
        let pool = plain_pool(3);
        let mut allocations = Vec::new();
        for _ in 0..20 {
            let held: Vec<_> = (0..8).map(|_| lend_one(&pool)).collect();
            for buffer in held {
                pool.return_lent(buffer);
            }
            allocations.push(pool.allocations());
        }
        assert_eq!(
            allocations[0],
            3 + 6,
            "one buffer per batch held beyond the slack"
        );
        assert!(
            allocations.iter().all(|&n| n == allocations[0]),
            "the later cycles reuse them: {allocations:?}"
        );
    }

    #[test]
    fn buffers_added_for_a_large_holding_are_freed_once_it_is_over() {
        let (pool, alive) = counted_pool(2, 100);
        let held: Vec<_> = (0..10).map(|_| lend_one(&pool)).collect();
        assert_eq!(pool.allocations(), 2 + 8, "one per batch beyond the slack");
        for buffer in held {
            pool.return_lent(buffer);
        }
        assert_eq!(
            alive.load(Ordering::SeqCst),
            10,
            "kept while the holding is recent"
        );
        // Then a loop holding one batch at a time, for two windows and a few batches more.
        for _ in 0..2 * HOLDING_WINDOW + 8 {
            let buffer = lend_one(&pool);
            pool.return_lent(buffer);
        }
        assert_eq!(alive.load(Ordering::SeqCst), 2, "freed down to the base");
        assert_eq!(pool.free().len(), 2);
        assert_eq!(pool.allocations(), 10, "nothing allocated since");
    }

    #[test]
    fn reserve_grows_every_free_buffer_once() {
        let pool = plain_pool(3);
        let held = pool.free().recv().unwrap();
        pool.reserve(5000);
        assert_eq!(pool.allocations(), 5, "the two free buffers grew");
        let mut free: Vec<_> = (0..2).map(|_| pool.free().try_recv().unwrap()).collect();
        for b in &mut free {
            assert!(b.bytes().len() >= 5000);
            pool.ensure_capacity(b, 5000);
        }
        assert_eq!(
            pool.allocations(),
            5,
            "grown buffers hold the batch: nothing more"
        );
        pool.reserve(100);
        assert_eq!(
            pool.allocations(),
            5,
            "nothing free to grow, nothing needed"
        );
        let mut held = held;
        pool.ensure_capacity(&mut held, 10);
        assert!(
            held.bytes().len() >= 5000,
            "the buffer that was out follows the high-water mark at its next use"
        );
        assert_eq!(pool.allocations(), 6);
    }

    /// The `VmFlags` of the mapping of `/proc/self/smaps` that starts at `address` (the
    /// last field of each mapping).
    fn vm_flags_at(address: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let header = format!("{address:x}-");
        smaps
            .lines()
            .skip_while(|l| !l.starts_with(&header))
            .find_map(|l| l.strip_prefix("VmFlags:").map(str::to_owned))
    }

    #[test]
    fn large_buffers_start_on_a_huge_page_resident_and_zeroed() {
        use crate::dataset::huge_pages::mapped_bytes;
        let bytes = 2 * HUGE_PAGE_BYTES + 12_345;
        let mut memory = PlainMemory::new(bytes);
        let start = memory.bytes().as_ptr() as usize;
        assert_eq!(memory.bytes().len(), bytes, "exactly the bytes asked for");
        assert_eq!(start % HUGE_PAGE_BYTES, 0, "on a huge-page boundary");
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.exists() {
            // Before anything reads it: populated at once, its whole huge pages in their own
            // mapping (the tail beyond them in small pages, outside it), asked for in huge
            // pages; whether the kernel had free huge pages to give is its own affair.
            let mapped = mapped_bytes(&[memory.bytes()]).expect("Linux: /proc/self/smaps");
            assert_eq!(
                mapped.resident,
                2 * HUGE_PAGE_BYTES as u64,
                "resident from the start"
            );
            let flags = vm_flags_at(start).expect("the huge pages' own mapping");
            assert!(
                flags.split_whitespace().any(|f| f == "hg"),
                "asked for in huge pages (MADV_HUGEPAGE): {flags}"
            );
            eprintln!(
                "{:.0}% in huge pages (transparent huge pages: {})",
                100.0 * mapped.huge_fraction().unwrap_or(0.0),
                std::fs::read_to_string(thp).unwrap_or_default().trim()
            );
        } else {
            eprintln!("skipped the huge-page checks: this kernel has no transparent huge pages");
        }
        assert!(memory.bytes().iter().all(|&b| b == 0), "zeroed");
        memory.bytes_mut()[bytes - 1] = 7;
        assert_eq!(memory.bytes()[bytes - 1], 7, "writable to its last byte");
        let small = PlainMemory::new(MAP_FROM_BYTES + 100);
        assert_eq!(small.bytes().len(), MAP_FROM_BYTES + 100);
        assert_eq!(small.bytes().as_ptr() as usize % BUFFER_ALIGN, 0);
    }

    /// Memory that counts how many of its kind are alive.
    struct Counted(PlainMemory, Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl HostMemory for Counted {
        fn bytes_mut(&mut self) -> &mut [u8] {
            self.0.bytes_mut()
        }
        fn bytes(&self) -> &[u8] {
            self.0.bytes()
        }
    }

    #[test]
    fn a_dropped_buffer_goes_home_and_is_freed_once_its_pool_is_gone() {
        let (pool, alive) = counted_pool(3, 64);
        let held = pool.free().recv().unwrap();
        assert_eq!(pool.free().len(), 2);
        drop(held);
        assert_eq!(pool.free().len(), 3, "dropped, the buffer went back");
        let kept = pool.free().recv().unwrap();
        assert_eq!(alive.load(Ordering::SeqCst), 3);
        drop(pool); // the two in the pool are freed with it
        assert_eq!(alive.load(Ordering::SeqCst), 1);
        drop(kept); // its pool is gone: freed, not sent again
        assert_eq!(
            alive.load(Ordering::SeqCst),
            0,
            "no buffer outlives its pool and users"
        );
    }

    #[test]
    fn a_free_buffer_last_filled_on_the_callers_cpu_comes_first() {
        let pool = plain_pool(4);
        let address = |b: &StagingBuffer| b.bytes().as_ptr() as usize;
        // Four buffers filled on CPUs 0, 1, 1, 0, freed in that order.
        let mut taken: Vec<StagingBuffer> = (0..4).map(|_| pool.free().recv().unwrap()).collect();
        for (buffer, cpu) in taken.iter_mut().zip([0, 1, 1, 0]) {
            buffer.gathered_on = Some(cpu);
        }
        let at: Vec<usize> = taken.iter().map(address).collect();
        drop(taken);
        // Behind the oldest (CPU 0's), the first of CPU 1's.
        let first = pool.take_free_for(Some(1)).unwrap();
        assert_eq!((address(&first), first.gathered_on()), (at[1], Some(1)));
        assert_eq!(pool.free().len(), 3, "the one passed over went back");
        // No buffer of CPU 7: the oldest free one, as the plain channel gives it.
        let second = pool.take_free_for(Some(7)).unwrap();
        assert_eq!(address(&second), at[2]);
        // Where the system names no CPU, plain first in, first out.
        let third = pool.take_free_for(None).unwrap();
        assert_eq!(address(&third), at[3]);
        let fourth = pool.take_free_for(Some(0)).unwrap();
        assert_eq!((address(&fourth), fourth.gathered_on()), (at[0], Some(0)));
        assert!(pool.take_free_for(Some(0)).is_none(), "all four taken");
        assert_eq!(pool.allocations(), 4, "none freed or added on the way");
        drop((first, second, third, fourth));
        assert_eq!(pool.free().len(), 4);
        // A buffer keeps its CPU through the pool; gathering marks it.
        // (The thread may move between CPUs around the mark: either is right.)
        let mut buffer = pool.take_free().unwrap();
        let before = crate::cores::current_cpu();
        buffer.mark_gathered_here();
        let after = crate::cores::current_cpu();
        assert!(
            buffer.gathered_on() == before || buffer.gathered_on() == after,
            "{:?} marked, on {before:?} then {after:?}",
            buffer.gathered_on()
        );
    }

    #[test]
    fn a_buffer_of_the_callers_cpu_beyond_those_looked_at_is_not_found() {
        let pool = plain_pool(FREE_BUFFERS_LOOKED_AT + 1);
        let address = |b: &StagingBuffer| b.bytes().as_ptr() as usize;
        let mut taken: Vec<StagingBuffer> =
            std::iter::from_fn(|| pool.free().try_recv().ok()).collect();
        assert_eq!(taken.len(), FREE_BUFFERS_LOOKED_AT + 1);
        for (k, buffer) in taken.iter_mut().enumerate() {
            buffer.gathered_on = Some(if k == FREE_BUFFERS_LOOKED_AT { 3 } else { 2 });
        }
        let first_freed = address(&taken[0]);
        drop(taken);
        let oldest = pool.take_free_for(Some(3)).unwrap();
        assert_eq!(
            (address(&oldest), oldest.gathered_on()),
            (first_freed, Some(2)),
            "the oldest, not the last one freed"
        );
        assert_eq!(pool.free().len(), FREE_BUFFERS_LOOKED_AT, "none lost");
        drop(oldest);
        // Once it is among the first looked at, it is found.
        let found = pool.take_free_for(Some(3)).unwrap();
        assert_eq!(found.gathered_on(), Some(3));
    }
}
