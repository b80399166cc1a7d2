//! The staging buffers a loader's settings hold, against the memory the process can have:
//! settings the machine cannot hold (`prefetch=1_000_000`, a worker count meant as an event
//! count) are an error naming them before anything is allocated, not a process the kernel
//! kills (the pool allocates its buffers when the loader starts, 1 MiB each at least).

use crate::batch::BatchLayout;
use crate::dataset::View;
use crate::device::{memory, Placement};
use crate::error::{Error, Result};
use crate::sampler::{Batching, EventLength};

use super::{LoaderConfig, INITIAL_BUFFER_BYTES};

/// Fails, naming `prefetch` or `workers`, when the staging buffers `config` starts with on
/// `placement` ([`LoaderConfig::staging_buffers`]), each at least the initial size and the
/// mean batch `config` asks of `view`, need more memory than this process can have. A
/// loader checks it before it allocates its pool; a caller that starts loaders later (the
/// Python package, at the first batch) can check it when it takes the settings.
pub fn check_staging_fits(view: &View, config: &LoaderConfig, placement: &Placement) -> Result<()> {
    check_staging_fits_with(view, config, config.batches_ahead(), placement)
}

/// [`check_staging_fits`] with `ahead` batches ahead, already resolved
/// ([`LoaderConfig::batches_ahead`]).
pub(super) fn check_staging_fits_with(
    view: &View,
    config: &LoaderConfig,
    ahead: usize,
    placement: &Placement,
) -> Result<()> {
    let Some(available) = memory::available() else {
        return Ok(());
    };
    let buffers = config.staging_buffers_with(ahead, placement);
    let batch = mean_batch_bytes(view, config);
    let per_buffer = batch.max(INITIAL_BUFFER_BYTES as f64);
    let total = per_buffer * buffers as f64;
    if total <= available.bytes as f64 {
        return Ok(());
    }
    let mib = |bytes: f64| format!("{:.0} MiB", bytes / f64::from(1 << 20));
    let beyond = format!("{} ({})", available.limited_by, mib(available.bytes as f64));
    if batch > available.bytes as f64 {
        // One batch alone is too large: the batching or the padded shape is wrong.
        let (field, what) = match config.layout {
            BatchLayout::Padded { .. } => ("layout", "padded batch (max_doms, pulses_per_dom)"),
            BatchLayout::Packed => ("batching", "batch"),
        };
        return Err(Error::config(
            field,
            format!("one {what} needs about {}, more than {beyond}", mib(batch)),
        ));
    }
    let field = if config.prefetch.is_none() || config.workers > ahead {
        "workers"
    } else {
        "prefetch"
    };
    Err(Error::config(
        field,
        format!(
            "{} workers and {} batches prefetched hold {buffers} staging buffers of at least \
             {} each, {} in all: more than {beyond}",
            config.workers,
            ahead,
            mib(per_buffer),
            mib(total),
        ),
    ))
}

/// The bytes of a mean batch of `config`'s batching and layout over `view`'s dataset, from
/// its manifest's totals (the heavy tail makes the largest batches several times larger).
/// Packed: the shards' bytes per event and each DOM's position. Padded: each event's rows
/// of `4 + 3K` float32 features and a mask byte, for its mean DOM count (or `max_doms`, when
/// smaller). In floating point: absurd settings must not overflow.
fn mean_batch_bytes(view: &View, config: &LoaderConfig) -> f64 {
    let manifest = view.dataset().manifest();
    let totals = &manifest.totals;
    let events = totals.events.max(1) as f64;
    let doms_per_event = totals.doms as f64 / events;
    let per_event = match config.layout {
        BatchLayout::Packed => {
            let position = 3.0 * manifest.schema.types.position.size() as f64;
            totals.bytes as f64 / events + doms_per_event * position
        }
        BatchLayout::Padded {
            max_doms,
            pulses_per_dom,
        } => {
            let row = (4.0 + 3.0 * pulses_per_dom as f64) * 4.0 + 1.0;
            doms_per_event.min(max_doms as f64) * row
        }
    };
    // A budgeted batch holds about its budget over the mean length: a pulse budget's
    // pulses, and a grouped batch's grid is nearly all tokens (both counted uncapped, from
    // the manifest's totals: with a pulse cap or a capped class a batch holds more events,
    // which this estimate of settings the machine cannot hold leaves out).
    let by_budget = |budget: usize, counted: u64| budget as f64 * events / counted.max(1) as f64;
    let batching = config.sampler.batching;
    let batch_events = match batching {
        Batching::Events(n) => n as f64,
        Batching::Pulses { max_pulses, .. } => by_budget(max_pulses, totals.pulses),
        Batching::Tokens { max_tokens, .. } => {
            let length = config.sampler.group_by_length.length_and_cap();
            by_budget(
                max_tokens,
                totals.of(length.map_or(EventLength::Pulses, |(l, _)| l)),
            )
        }
    }
    .min(batching.max_events().map_or(f64::INFINITY, |m| m as f64));
    per_event * batch_events.min(events)
}
