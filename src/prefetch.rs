//! Software prefetch: random reads (events in shuffled order, from shards or from a
//! bucket's records) start each column with a cache miss; asking for the memory of the
//! events a few steps ahead lets those misses overlap instead of stalling one by one.

use crate::format::pod::{as_bytes, Pod};

/// Most bytes prefetched from one slice (the hardware prefetcher follows a long copy once
/// it has started).
const PREFETCH_BYTES: usize = 512;

/// Hints the CPU to bring the first 512 bytes of `values` into cache. Does nothing on
/// other architectures than x86-64.
#[inline]
pub(crate) fn prefetch<T: Pod>(values: &[T]) {
    #[cfg(target_arch = "x86_64")]
    for line in as_bytes(values).chunks(64).take(PREFETCH_BYTES / 64) {
        // SAFETY: a prefetch is only a hint: it never faults and has no visible effect;
        // the address is inside a live slice. (Safe to call since Rust 1.87.)
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = values;
}
