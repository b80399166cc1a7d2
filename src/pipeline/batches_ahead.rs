//! How many batches a loader prepares ahead of its consumer when its configuration does not
//! say (`LoaderConfig::prefetch` is `None`).
//!
//! Batches are handed on in order while workers finish out of order, so each worker that
//! gathers at the same time as the others needs room to run ahead of a slow batch. On an
//! H200's 16 cores with 8 workers and no training step, 4 batches ahead left the consumer
//! waiting 28% of the time; 16 raised delivery from 7.6-7.9M to 11.5-11.7M events/s, and the
//! CPU path's from 9.4-9.5M to 13.7-14.0M (docs/results.md, "Batches ahead, by the
//! workers"). Workers beyond the cores take turns instead: on the 2-core machine 8 workers
//! delivered 0.90-0.95x with 16 batches ahead what they did with 4. PyTorch's `DataLoader`
//! likewise keeps `prefetch_factor` (2) batches per worker.

use crate::cores::available_cores;

/// Batches ahead for `workers` gathering threads on `cores` cores: twice the workers that
/// can run at once (`workers`, at most `cores`), at least 4. Two workers keep 4: on the
/// 2-core machine 8 or 16 changed nothing or were slower.
pub fn default_prefetch(workers: usize, cores: usize) -> usize {
    workers.min(cores).saturating_mul(2).max(4)
}

/// `prefetch`, or when it is `None`, [`default_prefetch`] of `workers` on this process's
/// [`available_cores`].
pub fn batches_ahead(prefetch: Option<usize>, workers: usize) -> usize {
    prefetch.unwrap_or_else(|| default_prefetch(workers, available_cores()))
}

#[cfg(test)]
mod tests {
    use super::{batches_ahead, default_prefetch};

    #[test]
    fn twice_the_workers_that_run_at_once_and_never_under_four() {
        for (workers, cores, ahead) in [
            (1, 16, 4),
            (2, 16, 4),
            (3, 16, 6),
            (8, 16, 16),
            (16, 16, 32),
            (32, 16, 32),
            (8, 2, 4),
            (2, 1, 4),
            (usize::MAX, usize::MAX, usize::MAX),
        ] {
            assert_eq!(
                default_prefetch(workers, cores),
                ahead,
                "{workers} on {cores}"
            );
        }
        // A number given is kept, whatever the workers.
        assert_eq!(batches_ahead(Some(1), 64), 1);
        assert_eq!(batches_ahead(Some(7), 1), 7);
    }
}
