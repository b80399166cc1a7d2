//! What the loader allocates per batch once its pool is warm, counted by a global
//! allocator (in a test binary of its own: the count is process-wide).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use shardify::dataset::ChecksumPolicy;
use shardify::device::{DeviceChoice, Placement};
use shardify::pipeline::{Loader, LoaderConfig};
use shardify::sampler::{Batching, SamplerConfig, SamplerState};

/// The system allocator, counting the allocations and reallocations made through it.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds
// `GlobalAlloc`'s contract; the counter is only incremented.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations a batch may cost once the pool is warm: none of its own. Each batch's plan
/// and section table come back with its staging buffer (until 2026-11-28 they were
/// allocated by the gathering thread and freed by the consumer's, 11 a batch), the
/// gather splits its buffer without a list (2 more a batch until the evening of
/// 2026-11-28), and the plans' queue reuses its vectors. What is left is the epoch's own:
/// its threads, channels and first chunk of plans, spread over its batches, and it varies
/// with the threads' timing: over 149 two-event batches 0.45-0.97 a batch, and 1.02 once
/// in CI (2026-11-29); over 299 one-event batches, as here, 0.24-0.57 in 20 runs. So one
/// allocation more per batch still fails the test, and the epoch's own cost does not.
const ALLOCATIONS_PER_BATCH: f64 = 1.0;

#[test]
fn a_warm_loader_allocates_almost_nothing_per_batch() {
    let dir = tempfile::tempdir().unwrap();
    let ds = fixture_dataset(dir.path(), 5, ChecksumPolicy::Lazy);
    let config = LoaderConfig {
        sampler: SamplerConfig {
            batching: Batching::Events(1),
            window_blocks: 4,
            block_events: 8,
            ..SamplerConfig::default()
        },
        workers: 2,
        prefetch: Some(3),
        device: DeviceChoice::Cpu,
        ..LoaderConfig::default()
    };
    let cpu = Placement::resolve(DeviceChoice::Cpu).unwrap();
    let mut pool = None;
    for epoch in 0..3 {
        let mut loader = Loader::on_pool(
            ds.clone(),
            config.clone(),
            SamplerState::start(epoch),
            cpu.clone(),
            pool.clone(),
        )
        .unwrap();
        pool = Some(Arc::clone(loader.staging_pool()));
        // Counted from the first batch on: the threads have started.
        drop(loader.next().unwrap().unwrap());
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let mut batches = 0u64;
        for batch in loader.by_ref() {
            drop(batch.unwrap());
            batches += 1;
        }
        let per_batch = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / batches as f64;
        eprintln!("epoch {epoch}: {batches} batches, {per_batch:.2} allocations a batch");
        assert!(
            batches >= 250,
            "{batches} batches: the epoch's own cost spreads over them"
        );
        if epoch > 0 {
            assert!(
                per_batch <= ALLOCATIONS_PER_BATCH,
                "epoch {epoch}: {per_batch:.2} allocations a batch"
            );
        }
    }
}
