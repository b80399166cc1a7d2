//! Software prefetch: random reads (events in shuffled order, from shards or from a
//! bucket's records) start each column with a cache miss; asking for the memory of the
//! events a few steps ahead lets those misses overlap instead of stalling one by one.

use crate::format::pod::{as_bytes, Pod};

/// Most bytes prefetched from one slice (the hardware prefetcher follows a long copy once
/// it has started). At 512, one thread gathered an epoch of 320k real-profile events at
/// window 16 in 67-69 ms; at 2 KiB in 58-60 (a mean event's pulse columns hold about 600
/// bytes each, with a heavy tail).
const PREFETCH_BYTES: usize = 2048;

/// Hints the CPU to bring the first 2 KiB of `values` into cache: every cache line they
/// touch, the partial first and last ones included (prefetching 64-byte steps from an
/// unaligned start missed the last line). Does nothing on other architectures than x86-64.
#[inline]
pub fn prefetch<T: Pod>(values: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = as_bytes(values);
        if bytes.is_empty() {
            return;
        }
        let start = bytes.as_ptr() as usize;
        let end = start + bytes.len().min(PREFETCH_BYTES);
        let mut line = start & !63;
        loop {
            // SAFETY: a prefetch is only a hint: it never faults and has no visible effect.
            #[allow(unused_unsafe)]
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    line as *const i8,
                )
            };
            line += 64;
            if line >= end {
                break;
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = values;
}

/// Visits `items` in order, keeping `ahead` of them prefetched: first asks
/// `prefetch_item` for the first `ahead` items, then, before visiting each, for the one
/// `ahead` places after it. Every item is asked for once, `ahead` visits before its own
/// (the first ones before any visit: a loop that starts prefetching at item `ahead`
/// leaves the first `ahead` to stall one by one).
#[inline]
pub fn visit_prefetching<T>(
    items: &[T],
    ahead: usize,
    mut prefetch_item: impl FnMut(&T),
    mut visit: impl FnMut(&T),
) {
    items.iter().take(ahead).for_each(&mut prefetch_item);
    for (k, item) in items.iter().enumerate() {
        if let Some(next) = items.get(k + ahead) {
            prefetch_item(next);
        }
        visit(item);
    }
}

#[cfg(test)]
mod tests {
    use super::visit_prefetching;

    /// The calls `visit_prefetching` makes over `n` items: `(true, i)` for a prefetch of
    /// item `i`, `(false, i)` for its visit.
    fn calls(n: usize, ahead: usize) -> Vec<(bool, usize)> {
        let items: Vec<usize> = (0..n).collect();
        let log = std::cell::RefCell::new(Vec::new());
        visit_prefetching(
            &items,
            ahead,
            |&i| log.borrow_mut().push((true, i)),
            |&i| log.borrow_mut().push((false, i)),
        );
        log.into_inner()
    }

    #[test]
    fn every_item_is_prefetched_once_ahead_visits_before_it_and_visited_once_in_order() {
        for (n, ahead) in [(0, 6), (3, 6), (6, 6), (7, 6), (40, 6), (40, 1), (5, 0)] {
            let log = calls(n, ahead);
            let visits: Vec<usize> = log.iter().filter(|c| !c.0).map(|c| c.1).collect();
            assert_eq!(visits, (0..n).collect::<Vec<_>>(), "n {n}, ahead {ahead}");
            let prefetches: Vec<usize> = log.iter().filter(|c| c.0).map(|c| c.1).collect();
            assert_eq!(
                prefetches, visits,
                "each once, in order: n {n}, ahead {ahead}"
            );
            for i in 0..n {
                let at = |call| log.iter().position(|&c| c == call).unwrap();
                let visits_before = log[..at((true, i))].iter().filter(|c| !c.0).count();
                // The first `ahead` before any visit, the rest `ahead` visits early.
                assert_eq!(
                    visits_before,
                    i.saturating_sub(ahead),
                    "n {n}, ahead {ahead}, item {i}"
                );
                assert!(at((true, i)) < at((false, i)));
            }
        }
    }
}
