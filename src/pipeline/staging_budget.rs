//! The staging buffers a loader's settings hold, against the memory the process can have:
//! settings the machine cannot hold (`prefetch=1_000_000`, a worker count meant as an event
//! count) are an error naming them before anything is allocated, not a process the kernel
//! kills (the pool allocates its buffers when the loader starts, 1 MiB each at least).

use crate::batch::BatchLayout;
use crate::dataset::{DatasetSizes, View};
use crate::device::{memory, Placement};
use crate::error::{Error, Result};
use crate::sampler::{Batching, EventLength, EventRef, EventSizes};

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
    // A budgeted batch holds about its budget over the mean length as the budget counts it:
    // a pulse budget's pulses, and a grouped batch's grid is nearly all tokens. Uncapped,
    // from the manifest's totals; capped (a pulse cap, a capped class), from a sample of
    // the events, since a cap makes a batch hold more of them (1.97x at a cap of 256 with
    // the real statistics).
    let by_budget = |budget: usize, length: EventLength, cap: Option<usize>| {
        let mean = cap
            .and_then(|cap| sampled_capped_mean(view, length, cap))
            .unwrap_or(totals.of(length) as f64 / events);
        budget as f64 / mean.max(f64::MIN_POSITIVE)
    };
    let batching = config.sampler.batching;
    let batch_events = match batching {
        Batching::Events(n) => n as f64,
        Batching::Pulses {
            max_pulses,
            pulse_cap,
            ..
        } => by_budget(max_pulses, EventLength::Pulses, pulse_cap),
        Batching::Tokens { max_tokens, .. } => {
            let length = config.sampler.group_by_length.length_and_cap();
            let (length, cap) = length.unwrap_or((EventLength::Pulses, None));
            by_budget(max_tokens, length, cap)
        }
    }
    .min(batching.max_events().map_or(f64::INFINITY, |m| m as f64));
    per_event * batch_events.min(events)
}

/// Events sampled for a capped mean length: runs of [`SAMPLE_RUN`] consecutive events
/// (consecutive in a shard, so their offsets are read together), spread evenly over the
/// view. A converted dataset is shuffled, so a run is a random sample.
const SAMPLE_RUNS: usize = 16;
/// Events in each of [`SAMPLE_RUNS`].
const SAMPLE_RUN: usize = 1024;

/// The mean of `view`'s events' `length`, each counted at most `cap`, over at most
/// [`SAMPLE_RUNS`] runs of [`SAMPLE_RUN`] events (every event of a smaller view); `None`
/// for a view without events or a shard that fails to open (the caller falls back on the
/// uncapped totals).
fn sampled_capped_mean(view: &View, length: EventLength, cap: usize) -> Option<f64> {
    let sizes = DatasetSizes::without_read_ahead(view);
    let events = sampled_runs(&sizes.shard_events(), SAMPLE_RUNS, SAMPLE_RUN);
    let mut lengths = Vec::with_capacity(events.len());
    sizes.lengths_into(&events, length, &mut lengths);
    if events.is_empty() || sizes.take_error().is_some() {
        return None;
    }
    let counted: usize = lengths.iter().map(|&l| l.min(cap)).sum();
    Some(counted as f64 / events.len() as f64)
}

/// `runs` runs of `run` consecutive events (fewer where the events are fewer), their
/// starts spread evenly over the events of shards of `shard_events` events, a run that
/// reaches a shard's end going on in the next one.
fn sampled_runs(shard_events: &[usize], runs: usize, run: usize) -> Vec<EventRef> {
    let total: usize = shard_events.iter().sum();
    let runs = runs.min(total.div_ceil(run.max(1)));
    let mut events = Vec::with_capacity(runs.saturating_mul(run).min(total));
    for r in 0..runs {
        let start = r * total / runs;
        let end = (start + run).min(total);
        let mut first = 0;
        for (shard, &count) in shard_events.iter().enumerate() {
            let (from, to) = (start.max(first), end.min(first + count));
            events.extend((from..to).map(|global| EventRef {
                shard: shard as u32,
                index: (global - first) as u32,
            }));
            first += count;
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dataset::small_shards_fixture;
    use crate::sampler::{LengthGrouping, SamplerConfig};

    /// Runs spread evenly, each of consecutive events, across shard ends and empty shards,
    /// every event inside its shard.
    #[test]
    fn sampled_runs_are_spread_and_cross_shards() {
        let at = |shard: u32, index: u32| EventRef { shard, index };
        // 30 events in shards of 10, 0 and 20: runs of 4 at 0, 10 and 20.
        let events = sampled_runs(&[10, 0, 20], 3, 4);
        let expected: Vec<EventRef> = (0..4)
            .map(|i| at(0, i))
            .chain((0..4).map(|i| at(2, i)))
            .chain((10..14).map(|i| at(2, i)))
            .collect();
        assert_eq!(events, expected);
        // A run over a shard's end goes on in the next one.
        assert_eq!(
            sampled_runs(&[3, 5], 1, 5),
            [at(0, 0), at(0, 1), at(0, 2), at(1, 0), at(1, 1)]
        );
        // Fewer events than the runs would take: every event, once.
        let all = sampled_runs(&[2, 3], 16, 1024);
        assert_eq!(all, [at(0, 0), at(0, 1), at(1, 0), at(1, 1), at(1, 2)]);
        assert!(sampled_runs(&[0, 0], 16, 1024).is_empty());
        // Many runs over many shards: each event inside its shard, in order, no repeat.
        let shards = [1000, 7, 0, 3000, 1];
        let events = sampled_runs(&shards, 16, 100);
        assert_eq!(events.len(), 1600);
        assert!(events
            .iter()
            .all(|e| e.index < shards[e.shard as usize] as u32));
        assert!(events
            .windows(2)
            .all(|w| (w[0].shard, w[0].index) < (w[1].shard, w[1].index)));
    }

    /// A capped budget's estimate counts each event's length up to the cap, as the sampler
    /// does: the fixture's 300 events are all sampled, so it is exact.
    #[test]
    fn a_capped_budget_is_estimated_from_the_capped_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let view = View::from(Arc::new(small_shards_fixture(dir.path())));
        assert!(view.dataset().shard_count() >= 2, "runs cross shards");
        let sizes = DatasetSizes::without_read_ahead(&view);
        // Every event: one run of them all.
        let all = sampled_runs(&sizes.shard_events(), 1, view.totals().events as usize);
        assert_eq!(all.len(), 300);
        let estimate = |batching, group_by_length| {
            let config = LoaderConfig {
                sampler: SamplerConfig {
                    batching,
                    group_by_length,
                    ..SamplerConfig::default()
                },
                ..LoaderConfig::default()
            };
            mean_batch_bytes(&view, &config)
        };
        let pulses = |max_pulses, pulse_cap| Batching::Pulses {
            max_pulses,
            max_events: None,
            pulse_cap,
        };
        let per_event = estimate(Batching::Events(1), LengthGrouping::Off);
        for (length, cap) in [(EventLength::Pulses, 20), (EventLength::Doms, 8)] {
            let capped: usize = all.iter().map(|&e| sizes.length(e, length).min(cap)).sum();
            let capped_mean = capped as f64 / all.len() as f64;
            let totals = &view.dataset().manifest().totals;
            let uncapped_mean = totals.of(length) as f64 / all.len() as f64;
            assert!(capped_mean < 0.8 * uncapped_mean, "{length}: the cap bites");
            let budget = 1024;
            let tokens = Batching::Tokens {
                max_tokens: budget,
                max_events: None,
                pad_to_multiple_of: None,
            };
            let grouped = match length {
                EventLength::Pulses => LengthGrouping::Pulses { cap: Some(cap) },
                EventLength::Doms => LengthGrouping::Doms { cap: Some(cap) },
            };
            let expected = per_event * budget as f64 / capped_mean;
            let got = estimate(tokens, grouped);
            assert!(
                (got / expected - 1.0).abs() < 1e-9,
                "{length}: {got} vs {expected}"
            );
            if length == EventLength::Pulses {
                let got = estimate(pulses(budget, Some(cap)), LengthGrouping::Off);
                assert!((got / expected - 1.0).abs() < 1e-9, "{got} vs {expected}");
                // Uncapped: from the totals, fewer events.
                let uncapped = estimate(pulses(budget, None), LengthGrouping::Off);
                let expected = per_event * budget as f64 / uncapped_mean;
                assert!(
                    (uncapped / expected - 1.0).abs() < 1e-9,
                    "{uncapped} vs {expected}"
                );
            }
        }
    }
}
