//! The staging buffers a loader's settings hold, against the memory the process can have:
//! settings the machine cannot hold (`prefetch=1_000_000`, a worker count meant as an event
//! count) are an error naming them before anything is allocated, not a process the kernel
//! kills (the pool allocates its buffers when the loader starts, 1 MiB each at least).

use crate::dataset::View;
use crate::device::{memory, Placement};
use crate::error::{Error, Result};
use crate::sampler::Batching;

use super::{LoaderConfig, INITIAL_BUFFER_BYTES};

/// Fails, naming `prefetch` or `workers`, when the staging buffers `config` starts with on
/// `placement` ([`LoaderConfig::staging_buffers`]), each at least the initial size and the
/// mean batch `config` asks of `view`, need more memory than this process can have. A
/// loader checks it before it allocates its pool; a caller that starts loaders later (the
/// Python package, at the first batch) can check it when it takes the settings.
pub fn check_staging_fits(view: &View, config: &LoaderConfig, placement: &Placement) -> Result<()> {
    let Some(available) = memory::available() else {
        return Ok(());
    };
    let buffers = config.staging_buffers(placement);
    let per_buffer = mean_batch_bytes(view, config).max(INITIAL_BUFFER_BYTES as u64);
    let total = per_buffer.saturating_mul(buffers as u64);
    if total <= available.bytes {
        return Ok(());
    }
    let field = if config.workers > config.prefetch {
        "workers"
    } else {
        "prefetch"
    };
    Err(Error::config(
        field,
        format!(
            "{} workers and {} batches prefetched hold {buffers} staging buffers of at least \
             {} MiB each, {} MiB in all: more than {} ({} MiB)",
            config.workers,
            config.prefetch,
            per_buffer >> 20,
            total >> 20,
            available.limited_by,
            available.bytes >> 20
        ),
    ))
}

/// The bytes of a mean batch of `config`'s batching over `view`'s dataset, from its
/// manifest's totals: the shards' bytes per event, and each DOM's position (the heavy tail
/// makes the largest batches several times larger).
fn mean_batch_bytes(view: &View, config: &LoaderConfig) -> u64 {
    let manifest = view.dataset().manifest();
    let totals = &manifest.totals;
    let events = totals.events.max(1) as f64;
    let positions = totals.doms * 3 * manifest.schema.types.position.size() as u64;
    let per_event = (totals.bytes + positions) as f64 / events;
    let batch_events = match config.sampler.batching {
        Batching::Events(n) => n as f64,
        Batching::Pulses {
            max_pulses,
            max_events,
        } => {
            let by_pulses = max_pulses as f64 * events / totals.pulses.max(1) as f64;
            by_pulses.min(max_events.map_or(f64::INFINITY, |m| m as f64))
        }
    };
    (per_event * batch_events.min(events)) as u64
}
