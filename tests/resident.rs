//! The resident loader's epoch plan: the streaming loader's batches, as flat arrays.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use shardify::batch::{BatchLayout, MAX_PACKED_ITEMS};
use shardify::dataset::{ChecksumPolicy, Dataset, View};
use shardify::device::DeviceChoice;
use shardify::pipeline::{Loader, LoaderConfig};
use shardify::resident::{plan_epoch, EpochPlan};
use shardify::sampler::{BatchOrder, Batching, SamplerConfig, SamplerState};
use shardify::Error;

fn dataset(dir: &Path) -> Arc<Dataset> {
    fixture_dataset(dir, 5, ChecksumPolicy::Lazy)
}

fn epoch_start(epoch: u64) -> SamplerState {
    SamplerState::start(epoch)
}

fn sampler(batching: Batching, order: BatchOrder, window_blocks: usize) -> SamplerConfig {
    SamplerConfig {
        seed: 11,
        block_events: 8,
        window_blocks,
        run_events: 2,
        batching,
        batch_order: order,
        ..SamplerConfig::default()
    }
}

/// Checks `plan` against what a streaming loader started at the same position delivers:
/// the same events in the same order, and every batch's DOM, pulse and widest-event counts.
fn assert_plan_is_the_stream(ds: &Arc<Dataset>, sampler: &SamplerConfig, position: SamplerState) {
    let plan = plan_epoch(&View::from(ds.clone()), sampler, position).unwrap();
    let config = LoaderConfig {
        sampler: sampler.clone(),
        device: DeviceChoice::Cpu,
        ..LoaderConfig::default()
    };
    let batches: Vec<_> = Loader::new(ds.clone(), config, position)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let starts: Vec<i64> = std::iter::once(0)
        .chain(ds.manifest().shards.iter().scan(0i64, |total, s| {
            *total += s.events as i64;
            Some(*total)
        }))
        .collect();
    assert_eq!(
        (plan.epoch, plan.first_batch),
        (position.epoch, position.batches_taken)
    );
    assert_eq!(plan.batches(), batches.len(), "{sampler:?} at {position:?}");
    assert!(!batches.is_empty());
    for (b, batch) in batches.iter().enumerate() {
        let streamed: Vec<i64> = batch
            .plan()
            .events
            .iter()
            .map(|e| starts[e.shard as usize] + i64::from(e.index))
            .collect();
        assert_eq!(
            plan.batch_events(b),
            &streamed[..],
            "batch {b} of {sampler:?}"
        );
        assert_eq!(plan.shape(b), batch.shape(), "batch {b}");
    }
    assert_eq!(*plan.starts.last().unwrap() as usize, plan.events.len());
}

#[test]
fn the_plan_is_the_streaming_loaders_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let total = ds.manifest().totals.events as usize;
    let start = epoch_start(3);
    let pulses = Batching::Pulses {
        max_pulses: 700,
        max_events: Some(9),
        pulse_cap: None,
    };
    for order in [BatchOrder::Stored, BatchOrder::Drawn] {
        for window in [1, 4, total.div_ceil(8)] {
            assert_plan_is_the_stream(&ds, &sampler(Batching::Events(10), order, window), start);
            assert_plan_is_the_stream(&ds, &sampler(pulses, order, window), start);
        }
    }
    // Every rank of a world of 3, with drop_last, from the middle of an epoch.
    for rank in 0..3 {
        let config = SamplerConfig {
            rank,
            world: 3,
            drop_last: true,
            ..sampler(Batching::Events(7), BatchOrder::Stored, 4)
        };
        let middle = SamplerState::at(1, 4);
        assert_plan_is_the_stream(&ds, &config, middle);
    }
}

#[test]
fn a_plan_with_a_batch_beyond_packed_offsets_is_refused_for_the_packed_layout_only() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let config = sampler(Batching::Events(10), BatchOrder::Stored, 4);
    let mut plan = plan_epoch(&View::from(ds), &config, epoch_start(0)).unwrap();
    let padded = BatchLayout::Padded {
        max_doms: 8,
        pulses_per_dom: 2,
    };
    plan.check_fits(BatchLayout::Packed).unwrap();
    // The last batch's pulses one past what I32 offsets count (a plan of billions of
    // pulses, as a batch of millions of events would make).
    let last = plan.batches() - 1;
    plan.pulses[last] = MAX_PACKED_ITEMS as i64 + 1;
    match plan.check_fits(BatchLayout::Packed) {
        Err(Error::Config { field, problem }) => {
            assert_eq!(field, "batching");
            assert!(
                problem.contains(&(MAX_PACKED_ITEMS + 1).to_string()),
                "{problem}"
            );
        }
        other => panic!("expected the batching setting refused, got {other:?}"),
    }
    plan.check_fits(padded).unwrap();
    plan.pulses[last] = MAX_PACKED_ITEMS as i64;
    plan.check_fits(BatchLayout::Packed).unwrap();
}

#[test]
fn a_whole_dataset_window_plans_every_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let total = ds.manifest().totals.events as i64;
    let config = sampler(Batching::Events(16), BatchOrder::Stored, 1 << 20);
    let plan = plan_epoch(&View::from(ds.clone()), &config, epoch_start(0)).unwrap();
    let mut seen = plan.events.clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..total).collect::<Vec<_>>());
    // A complete shuffle: a batch draws from the whole dataset, not from one block.
    let spread =
        plan.batch_events(0).iter().max().unwrap() - plan.batch_events(0).iter().min().unwrap();
    assert!(
        spread > 4 * 16,
        "the first batch spans only {spread} positions"
    );
    assert_eq!(
        plan.doms.iter().sum::<i64>() as u64,
        ds.manifest().totals.doms
    );
    assert_eq!(
        plan.pulses.iter().sum::<i64>() as u64,
        ds.manifest().totals.pulses
    );
    let past_the_end = SamplerState::at(0, plan.batches() as u64);
    assert_eq!(
        plan_epoch(&View::from(ds), &config, past_the_end).unwrap(),
        EpochPlan {
            first_batch: plan.batches() as u64,
            starts: vec![0],
            ..EpochPlan::default()
        }
    );
}

#[test]
fn a_damaged_shard_fails_the_plan_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let file = ds.manifest().shards[1].file.clone();
    flip_last_byte(&dir.path().join("ds").join(&file));
    let fresh = View::from(Arc::new(
        Dataset::open(&dir.path().join("ds"), ChecksumPolicy::Lazy).unwrap(),
    ));
    let config = sampler(Batching::Events(16), BatchOrder::Stored, 4);
    let err = plan_epoch(&fresh, &config, epoch_start(0))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&file) && err.contains("checksum"), "{err}");
    let bad = SamplerConfig {
        window_blocks: 0,
        ..config
    };
    let err = plan_epoch(&fresh, &bad, epoch_start(0)).unwrap_err();
    assert!(err.to_string().contains("window_blocks"), "{err}");
}
