//! The streaming loader: content, order, layouts, allocation, resume, shutdown, errors.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use shardify::batch::{sections, BatchLayout, ColumnsPasses};
use shardify::convert::Silent;
use shardify::dataset::copy::copy_dataset;
use shardify::dataset::{ChecksumPolicy, Dataset, View};
use shardify::device::{DeviceChoice, Placement};
use shardify::format::ShardLayout;
use shardify::pipeline::{Batch, Loader, LoaderConfig, LoaderState};
use shardify::prefetch::PrefetchLevel;
use shardify::sampler::{BatchOrder, Batching, LengthGrouping, SamplerConfig, SamplerState};
use shardify::Error;

fn dataset(dir: &Path) -> Arc<Dataset> {
    let out = dir.join("ds");
    if !out.join("manifest.json").exists() {
        convert_all(&fixture(), "train", &out, &options(5, 2)).unwrap();
    }
    Arc::new(Dataset::open(&out, ChecksumPolicy::Lazy).unwrap())
}

fn config(batching: Batching, workers: usize) -> LoaderConfig {
    LoaderConfig {
        sampler: SamplerConfig {
            seed: 3,
            block_events: 8,
            window_blocks: 4,
            run_events: 3,
            batching,
            // Shuffled inside batches: the gather's general case (runs scattered in the batch).
            batch_order: BatchOrder::Drawn,
            shuffle: true,
            group_by_length: LengthGrouping::Off,
            drop_last: false,
            rank: 0,
            world: 1,
        },
        layout: BatchLayout::Packed,
        workers,
        prefetch: Some(3),
        device: DeviceChoice::Cpu,
        ..LoaderConfig::default()
    }
}

fn epoch(ds: &Arc<Dataset>, config: &LoaderConfig, epoch: u64) -> Vec<Batch> {
    Loader::new(ds.clone(), config.clone(), SamplerState::start(epoch))
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// Checks a packed batch against the shards, event by event, field by field.
fn check_packed(ds: &Dataset, batch: &Batch) {
    let v = batch.packed().unwrap();
    assert_eq!(v.event_dom_offsets[0], 0);
    assert_eq!(v.dom_pulse_offsets[0], 0);
    for (b, e) in batch.plan().events.iter().enumerate() {
        let shard_columns = ds.shard(e.shard as usize).unwrap().columns().unwrap();
        let shard = shard_columns.view();
        let i = e.index as usize;
        assert_eq!(v.event_id[b], shard.event_id[i]);
        assert_eq!(
            v.event_azimuth[b].to_bits(),
            shard.event_azimuth.unwrap()[i].to_bits()
        );
        let doms = shard.dom_range(i);
        let out_doms = v.event_dom_offsets[b] as usize..v.event_dom_offsets[b + 1] as usize;
        assert_eq!(out_doms.len(), doms.len());
        for (od, d) in out_doms.zip(doms) {
            let sensor = shard.dom_sensor_id.get(d);
            assert_eq!(v.dom_sensor_id.get(od), sensor);
            if let Some(position) = v.dom_position {
                let row = ds.sensor_table().position(sensor).unwrap();
                for (k, expected) in row.into_iter().enumerate() {
                    assert_eq!(position.get(3 * od + k).to_bits(), expected.to_bits());
                }
            }
            let (op, p) = (
                v.dom_pulse_offsets[od] as usize..v.dom_pulse_offsets[od + 1] as usize,
                shard.pulse_range(d),
            );
            assert_eq!(op.len(), p.len());
            for (a, b) in op.zip(p) {
                assert_eq!(v.pulse_time.get(a), shard.pulse_time.get(b));
                assert_eq!(
                    v.pulse_charge.get(a).to_bits(),
                    shard.pulse_charge.get(b).to_bits()
                );
                assert_eq!(v.pulse_auxiliary[a], shard.pulse_auxiliary[b]);
            }
        }
    }
    assert_eq!(
        *v.event_dom_offsets.last().unwrap() as usize + 1,
        v.dom_pulse_offsets.len()
    );
    assert_eq!(
        *v.dom_pulse_offsets.last().unwrap() as usize,
        v.pulse_time.len()
    );
}

#[test]
fn a_whole_epoch_delivers_every_event_once_with_exact_content() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let mut drawn = [
        Batching::Events(7),
        Batching::Pulses {
            max_pulses: 600,
            max_events: None,
            pulse_cap: None,
        },
        Batching::Tokens {
            max_tokens: 900,
            max_events: Some(20),
            pad_to_multiple_of: Some(8),
        },
    ]
    .map(|batching| config(batching, 3));
    // A token budget counts the padded grid of batches grouped by length.
    drawn[2].sampler.group_by_length = LengthGrouping::Pulses { cap: Some(64) };
    let stored = drawn.clone().map(|mut c| {
        c.sampler.batch_order = BatchOrder::Stored;
        c
    });
    // Window 1, blocks the size of a batch: every batch but the last is one block, one run.
    let mut whole_blocks = config(Batching::Events(8), 2);
    whole_blocks.sampler = SamplerConfig {
        block_events: 8,
        window_blocks: 1,
        run_events: 1,
        batch_order: BatchOrder::Stored,
        ..whole_blocks.sampler
    };
    for config in drawn.iter().chain(&stored).chain([&whole_blocks]) {
        let batches = epoch(&ds, config, 0);
        let mut ids = BTreeSet::new();
        for (k, batch) in batches.iter().enumerate() {
            assert_eq!(batch.plan().global_index, k as u64, "in order");
            check_packed(&ds, batch);
            ids.extend(batch.packed().unwrap().event_id.iter().copied());
            if config.sampler.batch_order == BatchOrder::Stored {
                assert!(batch.plan().events.windows(2).all(|w| w[0] < w[1]));
            }
        }
        assert_eq!(ids.len(), 300);
        assert_eq!(
            batches.iter().map(|b| b.plan().events.len()).sum::<usize>(),
            300
        );
    }
}

#[test]
fn positions_can_be_left_out_of_packed_batches() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let with = config(Batching::Events(16), 2);
    let without = LoaderConfig {
        dom_positions: false,
        ..with.clone()
    };
    let (a, b) = (epoch(&ds, &with, 1), epoch(&ds, &without, 1));
    assert_eq!(a.len(), b.len());
    let position_size = ds.sensor_table().dtype().size();
    for (a, b) in a.iter().zip(&b) {
        check_packed(&ds, b);
        assert!(a.packed().unwrap().dom_position.is_some());
        assert!(b.packed().unwrap().dom_position.is_none());
        assert!(b.sections().get(sections::DOM_POSITION).is_none());
        for s in &b.sections().list {
            let other = a.sections().get(s.name).unwrap();
            assert_eq!(
                (s.dtype, &s.shape),
                (other.dtype, &other.shape),
                "{}",
                s.name
            );
            assert_eq!(
                &b.bytes()[s.offset..s.offset + s.len],
                &a.bytes()[other.offset..other.offset + other.len],
                "{}",
                s.name
            );
        }
        assert_eq!(
            a.sections().payload_bytes() - b.sections().payload_bytes(),
            a.shape().doms * 3 * position_size
        );
    }
    let padded = LoaderConfig {
        layout: BatchLayout::Padded {
            max_doms: 8,
            pulses_per_dom: 2,
        },
        ..without
    };
    let start = SamplerState::start(0);
    let err = Loader::new(ds, padded, start).err().unwrap();
    assert!(
        matches!(
            &err,
            shardify::Error::Config {
                field: "dom_positions",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn batches_do_not_depend_on_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let bytes = |workers| {
        epoch(&ds, &config(Batching::Events(16), workers), 2)
            .iter()
            .map(|b| b.bytes().to_vec())
            .collect::<Vec<_>>()
    };
    let one = bytes(1);
    assert!(one == bytes(4), "1 and 4 workers give different batches");
    assert!(
        one != epoch(&ds, &config(Batching::Events(16), 1), 3)
            .iter()
            .map(|b| b.bytes().to_vec())
            .collect::<Vec<_>>(),
        "epochs differ"
    );
}

/// The thread waiting for a batch gathers while it waits (`consumer_gathers`): the batches,
/// their order and their bytes are those the workers alone deliver, and the batches it
/// gathered are counted. One worker and one-event batches that the consumer drops at once:
/// the next batch is often not ready, so the waiting thread really gathers (up to 3 epochs
/// are tried for it to happen at least once).
#[test]
fn batches_do_not_depend_on_which_thread_gathers_them() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let run = |gathers: bool, e: u64| {
        let config = LoaderConfig {
            consumer_gathers: gathers,
            ..config(Batching::Events(1), 1)
        };
        let mut loader = Loader::new(ds.clone(), config, SamplerState::start(e)).unwrap();
        let (mut batches, mut flagged) = (Vec::new(), 0u64);
        for batch in loader.by_ref() {
            let batch = batch.unwrap();
            if batch.gathered_while_waiting() {
                flagged += 1;
                assert_eq!(
                    batch.buffer_wait_seconds(),
                    0.0,
                    "no worker waited for a batch the waiting thread gathered"
                );
            }
            batches.push((batch.plan().clone(), batch.bytes().to_vec()));
        }
        assert_eq!(
            flagged,
            loader.gathered_while_waiting(),
            "the batches flagged are the ones the loader counts"
        );
        (batches, flagged)
    };
    let mut gathered_while_waiting = 0;
    for e in 0..3 {
        let (alone, none) = run(false, e);
        assert_eq!(none, 0, "a waiting thread that sleeps gathers nothing");
        assert_eq!(alone.len() as u64, ds.manifest().totals.events);
        let (helped, gathered) = run(true, e);
        assert!(
            alone == helped,
            "epoch {e}: the waiting thread changed the batches"
        );
        gathered_while_waiting += gathered;
        if gathered_while_waiting > 0 {
            break;
        }
    }
    assert!(
        gathered_while_waiting > 0,
        "in 3 epochs of one-event batches the waiting thread never gathered one"
    );
}

/// Every gather holds a permit, and a loader has one for each worker or each core,
/// whichever is more: the waiting thread gathers in a worker's place, never beside all of
/// them. On a thread pinned to one CPU (the loader's threads inherit the pinning) a loader
/// of one worker has one permit: the permit was held, never twice at once, and the batches
/// are those of the worker alone.
#[test]
fn with_as_many_workers_as_cores_no_more_threads_gather_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    // A thread of its own, so that the pinning stays out of the other tests' threads.
    std::thread::spawn(move || {
        if !pin_to_one_cpu() {
            eprintln!("skipped: this thread cannot be pinned to one CPU here");
            return;
        }
        let run = |gathers: bool, e: u64| {
            let config = LoaderConfig {
                consumer_gathers: gathers,
                ..config(Batching::Events(1), 1)
            };
            let mut loader = Loader::new(ds.clone(), config, SamplerState::start(e)).unwrap();
            let batches: Vec<_> = loader
                .by_ref()
                .map(|b| {
                    let b = b.unwrap();
                    (b.plan().clone(), b.bytes().to_vec())
                })
                .collect();
            (batches, loader.most_gathering_at_once())
        };
        for e in 0..2 {
            let (alone, (most_alone, permits_alone)) = run(false, e);
            let (helped, (most, permits)) = run(true, e);
            assert_eq!(alone.len() as u64, ds.manifest().totals.events);
            assert!(
                alone == helped,
                "epoch {e}: the permits changed the batches"
            );
            assert_eq!((permits_alone, permits), (1, 1), "one worker on one core");
            assert_eq!(
                (most_alone, most),
                (1, 1),
                "epoch {e}: permits held at once"
            );
        }
    })
    .join()
    .unwrap();
}

/// Pins the calling thread to the CPU it runs on; false where it cannot be (or on a system
/// without `sched_setaffinity`), or where the loader would still count more than one core.
fn pin_to_one_cpu() -> bool {
    #[cfg(target_os = "linux")]
    {
        let Some(cpu) = shardify::cores::current_cpu() else {
            return false;
        };
        let cpu = cpu as usize;
        // SAFETY: a `cpu_set_t` is plain bits; all zeros is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is a CPU number the kernel just gave, below `CPU_SETSIZE`; the set is
        // ours, and `sched_setaffinity` reads exactly its size for the calling thread (0).
        let pinned = unsafe {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        pinned && shardify::cores::available_cores() == 1
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// `next_within` lets a caller poll (Python checks for Ctrl-C between polls): it gives the
/// same batches as `next`, and the waiting thread starts no gather once the wait is over, so
/// polling with no wait at all never gathers while waiting.
#[test]
fn polling_gives_the_same_batches_and_gathers_nothing_past_the_deadline() {
    use shardify::pipeline::Arrival;
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let config = config(Batching::Events(4), 1);
    let expected = epoch_bytes(&ds, &config, 1);
    let mut loader = Loader::new(ds.clone(), config, SamplerState::start(1)).unwrap();
    let (mut polled, mut not_yet) = (Vec::new(), 0);
    loop {
        match loader.next_within(Duration::ZERO) {
            Arrival::Ready(batch) => polled.push(batch.unwrap().bytes().to_vec()),
            Arrival::NotYet => not_yet += 1,
            Arrival::Finished => break,
        }
    }
    assert!(polled == expected, "polling changed the batches");
    assert_eq!(
        loader.gathered_while_waiting(),
        0,
        "{not_yet} polls came back empty"
    );
    assert!(loader.next().is_none(), "the epoch stays over");
}

#[test]
fn padded_layout_matches_the_packed_one() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let (max_doms, k) = (12, 2);
    let packed = epoch(&ds, &config(Batching::Events(9), 2), 1);
    let mut padded_config = config(Batching::Events(9), 2);
    padded_config.layout = BatchLayout::Padded {
        max_doms,
        pulses_per_dom: k,
    };
    let padded = epoch(&ds, &padded_config, 1);
    assert_eq!(packed.len(), padded.len());
    for (p, q) in packed.iter().zip(&padded) {
        let (p, q) = (p.packed().unwrap(), q.padded().unwrap());
        assert_eq!(p.event_id, q.event_id);
        assert_eq!(q.features_per_dom, 4 + 3 * k);
        let m = q.max_doms;
        assert!(m <= max_doms);
        for b in 0..p.event_id.len() {
            let doms = p.event_dom_offsets[b] as usize..p.event_dom_offsets[b + 1] as usize;
            for slot in 0..m {
                let row =
                    &q.dom_features[(b * m + slot) * q.features_per_dom..][..q.features_per_dom];
                if slot >= doms.len() {
                    assert_eq!(q.dom_mask[b * m + slot], 0);
                    assert!(row.iter().all(|&x| x == 0.0));
                    continue;
                }
                let d = doms.start + slot;
                assert_eq!(q.dom_mask[b * m + slot], 1);
                let position = p.dom_position.unwrap();
                assert_eq!(row[0], position.get(3 * d) as f32);
                assert_eq!(row[1], position.get(3 * d + 1) as f32);
                assert_eq!(row[2], position.get(3 * d + 2) as f32);
                let pulses = p.dom_pulse_offsets[d] as usize..p.dom_pulse_offsets[d + 1] as usize;
                assert_eq!(row[3], pulses.len() as f32);
                for j in 0..k {
                    let expect = if j < pulses.len() {
                        let i = pulses.start + j;
                        [
                            p.pulse_time.get(i) as f32,
                            p.pulse_charge.get(i) as f32,
                            p.pulse_auxiliary[i] as f32,
                        ]
                    } else {
                        [0.0; 3]
                    };
                    assert_eq!(&row[4 + 3 * j..7 + 3 * j], &expect);
                }
            }
        }
    }
}

#[test]
fn the_steady_state_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let config = config(
        Batching::Pulses {
            max_pulses: 120,
            max_events: None,
            pulse_cap: None,
        },
        2,
    );
    let mut loader = Loader::new(ds, config.clone(), SamplerState::start(0)).unwrap();
    let initial = loader.staging_allocations();
    assert!(initial > 0, "the pool is filled up front");
    let mut delivered = 0;
    for batch in loader.by_ref() {
        batch.unwrap();
        delivered += 1;
    }
    assert!(delivered > 10 * initial as usize, "{delivered} batches");
    assert_eq!(
        loader.staging_allocations(),
        initial,
        "1 MiB buffers hold every batch of this budget: no allocation at all"
    );
}

#[test]
fn a_dropped_batch_leaves_its_plan_and_section_table_for_the_next_gather() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let config = config(Batching::Events(16), 2);
    let mut loader = Loader::new(ds, config, SamplerState::start(0)).unwrap();
    let pool = loader.staging_pool().clone();
    let mut batches = 0;
    let mut last = loader.next().unwrap().unwrap();
    for batch in loader.by_ref() {
        last = batch.unwrap();
        batches += 1;
    }
    assert!(batches > 5, "{batches} batches");
    let events = last.plan().events.clone();
    let sections = last.sections().clone();
    let address = last.plan().events.as_ptr();
    drop(last);
    // Every buffer a batch was gathered into came back with that batch's vectors (a plan
    // asked for past the epoch's end empties its events but keeps their memory); the last
    // batch's are there as it had them: the same memory, not a copy.
    let free: Vec<_> = std::iter::from_fn(|| pool.take_free()).collect();
    let kept: Vec<_> = free
        .into_iter()
        .filter(|b| b.gathered_on().is_some() || cfg!(not(target_os = "linux")))
        .map(|mut b| b.take_vectors())
        .collect();
    assert!(!kept.is_empty());
    for vectors in &kept {
        assert!(
            vectors.events.capacity() >= 16 && !vectors.sections.list.is_empty(),
            "a used buffer came back without its batch's vectors: {vectors:?}"
        );
    }
    let found = kept
        .iter()
        .position(|v| v.events.as_ptr() == address)
        .expect("the last batch's events went back with its buffer");
    assert_eq!(kept[found].events, events);
    assert_eq!(kept[found].sections, sections);
}

#[test]
fn a_slow_consumer_shows_as_the_workers_waiting_for_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    // One batch ahead (5 staging buffers: 2 workers, 1 ahead, 2 for the consumer) and a
    // consumer that takes 20 ms a batch: the workers gather in well under a millisecond,
    // fill every buffer, then each waits for the one the consumer frees next.
    let mut config = config(Batching::Events(16), 2);
    config.prefetch = Some(1);
    // Only workers gather (theirs are the waits counted).
    config.consumer_gathers = false;
    let pause = Duration::from_millis(20);
    let (mut batches, mut waited) = (0u32, 0.0);
    for batch in Loader::new(ds, config, SamplerState::start(0)).unwrap() {
        let wait = batch.unwrap().buffer_wait_seconds();
        assert!(wait >= 0.0, "{wait}");
        waited += wait;
        batches += 1;
        std::thread::sleep(pause);
    }
    assert!(batches >= 16, "{batches} batches");
    // After the first six batches each worker waits about two pauses per batch of its own.
    let floor = pause.as_secs_f64() * f64::from(batches - 6);
    assert!(
        waited >= floor,
        "workers blocked {waited:.3} s for buffers, expected at least {floor:.3} s"
    );
}

#[test]
fn planning_time_comes_with_one_batch_in_sixteen_at_most() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    for workers in [1, 2] {
        let batches = epoch(&ds, &config(Batching::Events(2), workers), 0);
        assert_eq!(batches.len(), 150, "300 events");
        let planned: Vec<f64> = batches
            .iter()
            .map(Batch::planning_seconds)
            .filter(|&s| s != 0.0)
            .collect();
        // The threads plan 16 at a time: 10 chunks, each timed with the batch its
        // thread took next. A thread that found none ready plans a chunk, takes its first
        // plan, and with 15 left plans the next: that batch carries two chunks' time.
        assert!(
            (1..=10).contains(&planned.len()),
            "{workers} workers: {} batches carry planning time",
            planned.len()
        );
        assert!(planned.iter().all(|&s| s > 0.0), "{planned:?}");
    }
}

#[test]
fn a_pool_handed_on_serves_the_next_loaders_without_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let config = config(Batching::Events(40), 2);
    let cpu = Placement::resolve(DeviceChoice::Cpu).unwrap();
    let mut first = Loader::on(
        ds.clone(),
        config.clone(),
        SamplerState::start(0),
        cpu.clone(),
    )
    .unwrap();
    // Stopped mid-epoch with batches in flight (prefetch 3): they go back to the pool.
    let held = first.next().unwrap().unwrap();
    let pool = first.staging_pool().clone();
    drop(first);
    let after_first = pool.allocations();
    for epoch in 1..4 {
        let loader = Loader::on_pool(
            ds.clone(),
            config.clone(),
            SamplerState::start(epoch),
            cpu.clone(),
            Some(pool.clone()),
        )
        .unwrap();
        let batches: Vec<Vec<u8>> = loader.map(|b| b.unwrap().bytes().to_vec()).collect();
        let fresh: Vec<Vec<u8>> = epoch_bytes(&ds, &config, epoch);
        assert_eq!(
            batches, fresh,
            "epoch {epoch}: the same batches as a fresh pool's"
        );
    }
    assert_eq!(
        pool.allocations(),
        after_first,
        "no buffer allocated after the first loader"
    );
    drop(held);
    // Each buffer a batch was gathered into remembers the CPU it was gathered on, so that
    // a gathering thread can take one it filled itself (`StagingPool::take_free`).
    let free: Vec<_> = std::iter::from_fn(|| pool.take_free()).collect();
    let marked = free.iter().filter(|b| b.gathered_on().is_some()).count();
    if cfg!(target_os = "linux") {
        assert!(
            marked >= 1,
            "{marked} of {} buffers marked with their CPU",
            free.len()
        );
    }
}

fn epoch_bytes(ds: &Arc<Dataset>, config: &LoaderConfig, e: u64) -> Vec<Vec<u8>> {
    epoch(ds, config, e)
        .iter()
        .map(|b| b.bytes().to_vec())
        .collect()
}

#[test]
fn resume_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let config = config(
        Batching::Pulses {
            max_pulses: 500,
            max_events: Some(12),
            pulse_cap: None,
        },
        2,
    );
    let whole = epoch_bytes(&ds, &config, 4);
    let mut loader = Loader::new(ds.clone(), config.clone(), SamplerState::start(4)).unwrap();
    let first: Vec<Vec<u8>> = loader
        .by_ref()
        .take(5)
        .map(|b| b.unwrap().bytes().to_vec())
        .collect();
    let saved = serde_json::to_string(&loader.state()).unwrap();
    drop(loader);
    let state: LoaderState = serde_json::from_str(&saved).unwrap();
    assert_eq!(state.position, SamplerState::at(4, 5));
    let rest = resumed_bytes(ds.clone(), &config, &state);
    assert!(
        [first, rest].concat() == whole,
        "resumed batches differ from the uninterrupted epoch"
    );
    let mut other = config.clone();
    other.sampler.seed += 1;
    assert!(
        Loader::resume(ds, other, &state).is_err(),
        "a state from another configuration is refused"
    );
}

/// The batches' bytes a loader of `view` resumed from `state` delivers.
fn resumed_bytes(
    view: impl Into<View>,
    config: &LoaderConfig,
    state: &LoaderState,
) -> Vec<Vec<u8>> {
    Loader::resume(view, config.clone(), state)
        .unwrap()
        .map(|b| b.unwrap().bytes().to_vec())
        .collect()
}

/// The problem of the `dataset` error resuming `state` on `view` gives.
fn refused_dataset(view: impl Into<View>, config: &LoaderConfig, state: &LoaderState) -> String {
    match Loader::resume(view, config.clone(), state) {
        Err(Error::Config {
            field: "dataset",
            problem,
        }) => problem,
        Err(other) => panic!("expected a dataset error, got {other}"),
        Ok(_) => panic!("a state saved reading other events was resumed"),
    }
}

#[test]
fn a_state_resumes_on_a_copy_in_either_layout_and_refuses_other_events() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let config = config(Batching::Events(7), 2);
    let mut loader = Loader::new(ds.clone(), config.clone(), SamplerState::start(1)).unwrap();
    loader.by_ref().take(3).for_each(|b| drop(b.unwrap()));
    let state = loader.state();
    drop(loader);
    let identity = View::from(ds.clone()).identity();
    assert_eq!(state.dataset.as_deref(), Some(identity.as_str()));
    let rest = resumed_bytes(ds.clone(), &config, &state);
    assert!(!rest.is_empty());

    // A copy elsewhere, in the records layout: the same events, the same rest.
    let records = dir.path().join("records");
    copy_dataset(ds.dir(), &records, Some(ShardLayout::Records), &Silent).unwrap();
    let records = Arc::new(Dataset::open(&records, ChecksumPolicy::Lazy).unwrap());
    assert_eq!(View::from(records.clone()).identity(), identity);
    assert!(resumed_bytes(records.clone(), &config, &state) == rest);

    // Another conversion of the same source (another seed): refused, naming both.
    let other = dir.path().join("other");
    convert_all(&fixture(), "train", &other, &options(6, 2)).unwrap();
    let other = Arc::new(Dataset::open(&other, ChecksumPolicy::Lazy).unwrap());
    let other_identity = View::from(other.clone()).identity();
    assert_ne!(other_identity, identity);
    let problem = refused_dataset(other.clone(), &config, &state);
    assert!(
        problem.contains(&identity) && problem.contains(&other_identity),
        "{problem}"
    );

    // A split is other events than its dataset; the same split of a copy is the same.
    let (train, validation) = View::from(ds.clone()).split(0.25, 9).unwrap();
    let problem = refused_dataset(train.clone(), &config, &state);
    assert!(problem.contains("a part of"), "{problem}");
    assert_ne!(train.identity(), validation.identity());
    let mut loader = Loader::new(train.clone(), config.clone(), SamplerState::start(0)).unwrap();
    loader.by_ref().take(2).for_each(|b| drop(b.unwrap()));
    let split_state = loader.state();
    drop(loader);
    let (same_train, _) = View::from(records).split(0.25, 9).unwrap();
    assert_eq!(same_train.identity(), train.identity());
    assert!(
        resumed_bytes(same_train, &config, &split_state)
            == resumed_bytes(train, &config, &split_state)
    );
    let (other_split, _) = View::from(ds).split(0.25, 10).unwrap();
    refused_dataset(other_split, &config, &split_state);

    // A state saved before the identity was recorded resumes unchecked.
    let mut old: serde_json::Value = serde_json::to_value(&state).unwrap();
    old.as_object_mut().unwrap().remove("dataset").unwrap();
    let old: LoaderState = serde_json::from_value(old).unwrap();
    assert_eq!(old.dataset, None);
    assert!(!resumed_bytes(other, &config, &old).is_empty());
}

#[test]
fn dropping_mid_epoch_stops_every_thread() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut loader =
            Loader::new(ds, config(Batching::Events(3), 4), SamplerState::start(0)).unwrap();
        let held = loader.next().unwrap().unwrap();
        let _second = loader.next().unwrap().unwrap();
        drop(loader);
        drop(held);
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the loader shut down instead of hanging");
}

#[test]
fn a_corrupt_or_missing_shard_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let file = &ds.manifest().shards[2].file;
    let path = dir.path().join("ds").join(file);
    flip_last_byte(&path);
    let (err, ended) = epoch_error(&dir.path().join("ds"), ChecksumPolicy::Lazy);
    assert!(
        err.contains(file.as_str()) && err.contains("checksum"),
        "{err}"
    );
    assert!(ended, "the error ends the iteration");

    std::fs::remove_file(&path).unwrap();
    let (err, _) = epoch_error(&dir.path().join("ds"), ChecksumPolicy::Off);
    assert!(err.contains(file.as_str()), "{err}");
}

/// The first error an epoch over `dir` yields, and whether it ended the iteration.
fn epoch_error(dir: &Path, policy: ChecksumPolicy) -> (String, bool) {
    let fresh = Arc::new(Dataset::open(dir, policy).unwrap());
    let state = SamplerState::start(0);
    first_error(Loader::new(fresh, config(Batching::Events(10), 2), state).unwrap())
}

/// The gather visits events in storage order and copies runs at once; whatever the order,
/// duplicates, shards or runs of a plan, every event must land at its batch position, the
/// same bytes from a records copy and from a columns shard copied in one pass or two.
#[test]
fn the_gather_places_every_event_of_any_plan() {
    use shardify::batch::{plan_sections, sections, Gatherer};
    use shardify::device::staging::{HostMemory, PlainMemory};
    use shardify::sampler::{BatchPlan, EventRef};

    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    assert!(ds.shard_count() >= 2, "the plans below mix shards");
    let e = |shard, index| EventRef { shard, index };
    // Every event of the first two shards, scrambled (a stride coprime to the count):
    // nearly every run one event, many more runs than the gather prefetches ahead.
    let shard_events = |s: usize| ds.manifest().shards[s].events as u32;
    let every: Vec<EventRef> = (0..2)
        .flat_map(|s| (0..shard_events(s)).map(move |i| e(s as u32, i)))
        .collect();
    let scrambled = (0..every.len())
        .map(|k| every[k * 7919 % every.len()])
        .collect();
    assert!(every.len() > 50 && !every.len().is_multiple_of(7919));
    let plans: Vec<Vec<EventRef>> = vec![
        (0..10).rev().map(|i| e(0, i)).collect(), // consecutive, descending in storage
        vec![e(1, 5), e(0, 5), e(1, 6), e(0, 6), e(0, 7)], // shards interleaved
        vec![e(0, 3), e(0, 3), e(0, 4), e(0, 3)], // duplicates
        vec![e(0, 10), e(0, 11), e(0, 12), e(1, 0), e(1, 1), e(0, 13)], // runs, then a break
        vec![e(1, 2)],
        scrambled,
    ];
    let types = ds.manifest().schema.types;
    let mut gatherer = Gatherer::new(&ds);
    let mut buffer = PlainMemory::new(1 << 20);
    // The same plans from a records copy: the same bytes.
    let records = dir.path().join("records");
    let layout = Some(shardify::format::ShardLayout::Records);
    shardify::dataset::copy::copy_dataset(ds.dir(), &records, layout, &shardify::convert::Silent)
        .unwrap();
    let records = Dataset::open(&records, ChecksumPolicy::Full).unwrap();
    let mut from_records = Gatherer::new(&records);
    let mut records_buffer = PlainMemory::new(1 << 20);
    let mut in_passes = [ColumnsPasses::One, ColumnsPasses::Two]
        .map(|passes| (passes, Gatherer::new(&ds).with_columns_passes(passes)));
    let mut passes_buffer = PlainMemory::new(1 << 20);
    for (k, events) in plans.into_iter().enumerate() {
        let plan = BatchPlan {
            global_index: k as u64,
            events,
        };
        let shape = gatherer.shape(&plan).unwrap();
        assert_eq!(from_records.shape(&plan).unwrap(), shape, "plan {k}: shape");
        let s = plan_sections(BatchLayout::Packed, shape, &types, true);
        gatherer
            .gather(&plan, BatchLayout::Packed, &s, buffer.bytes_mut())
            .unwrap();
        from_records
            .gather(&plan, BatchLayout::Packed, &s, records_buffer.bytes_mut())
            .unwrap();
        let bytes = buffer.bytes();
        assert!(
            bytes[..s.total] == records_buffer.bytes()[..s.total],
            "plan {k}: the records copy gathered other bytes"
        );
        for (passes, columns) in in_passes.iter_mut() {
            passes_buffer.bytes_mut().fill(0xa5);
            columns
                .gather(&plan, BatchLayout::Packed, &s, passes_buffer.bytes_mut())
                .unwrap();
            assert!(
                bytes[..s.total] == passes_buffer.bytes()[..s.total],
                "plan {k}: {passes} pass(es) gathered other bytes"
            );
        }
        let section = |name| {
            let info = s.get(name).unwrap();
            &bytes[info.offset..info.offset + info.len]
        };
        let words = |name, size: usize| -> Vec<i64> {
            section(name)
                .chunks_exact(size)
                .map(|c| match size {
                    4 => i32::from_le_bytes(c.try_into().unwrap()) as i64,
                    _ => i64::from_le_bytes(c.try_into().unwrap()),
                })
                .collect()
        };
        let (ids, event_doms, dom_pulses) = (
            words(sections::EVENT_ID, 8),
            words(sections::EVENT_DOM_OFFSETS, 4),
            words(sections::DOM_PULSE_OFFSETS, 4),
        );
        let (time, time_size) = (section(sections::PULSE_TIME), types.time.size());
        for (b, r) in plan.events.iter().enumerate() {
            let v_columns = ds.shard(r.shard as usize).unwrap().columns().unwrap();
            let v = v_columns.view();
            let i = r.index as usize;
            assert_eq!(ids[b], v.event_id[i], "plan {k}, position {b}: event id");
            let doms = v.dom_range(i);
            let (d0, d1) = (event_doms[b] as usize, event_doms[b + 1] as usize);
            assert_eq!(d1 - d0, doms.len(), "plan {k}, position {b}: DOM count");
            let (p0, p1) = (dom_pulses[d0] as usize, dom_pulses[d1] as usize);
            let pulses = v.event_pulse_range(i);
            assert_eq!(p1 - p0, pulses.len(), "plan {k}, position {b}: pulse count");
            let (source, _) = v.pulse_time.raw();
            assert_eq!(
                &time[p0 * time_size..p1 * time_size],
                &source[pulses.start * time_size..pulses.end * time_size],
                "plan {k}, position {b}: pulse times"
            );
        }
    }
}

/// Whether `path` lies on a tmpfs (memory only: nothing to evict to).
fn on_tmpfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut stats = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a NUL-terminated path and writable memory of the right type, filled on 0.
    let stats = unsafe {
        assert_eq!(libc::statfs(c_path.as_ptr(), stats.as_mut_ptr()), 0);
        stats.assume_init()
    };
    // The field's type differs between platforms.
    #[allow(clippy::unnecessary_cast)]
    let tmpfs = stats.f_type as i64 == libc::TMPFS_MAGIC as i64;
    tmpfs
}

/// Pages of `path` in the page cache.
fn resident_pages(path: &Path) -> usize {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only map of a file nothing writes during the test.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let page = 4096;
    let mut flags = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: the map is `map.len()` bytes long and page-aligned; `flags` has a byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), flags.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore");
    flags.iter().filter(|&&f| f & 1 == 1).count()
}

#[test]
fn evicting_drops_every_shard_from_the_page_cache_and_reads_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path());
    let out = dir.path().join("ds");
    let ds = Arc::new(Dataset::open(&out, ChecksumPolicy::Full).unwrap());
    let files: Vec<_> = ds
        .manifest()
        .shards
        .iter()
        .map(|s| out.join(&s.file))
        .collect();
    if on_tmpfs(&out) {
        println!(
            "SKIPPED: {} is on tmpfs, whose pages cannot leave memory",
            out.display()
        );
        return;
    }
    let before: usize = files.iter().map(|f| resident_pages(f)).sum();
    assert!(before > 0, "a full checksum reads every shard");
    let batches = epoch(&ds, &config(Batching::Events(16), 2), 0);
    ds.evict_from_page_cache().unwrap();
    let after: usize = files.iter().map(|f| resident_pages(f)).sum();
    assert_eq!(after, 0, "{before} pages resident before, {after} after");
    // Read again from the disk, through read-ahead (window 4): the same bytes.
    let again = epoch(&ds, &config(Batching::Events(16), 2), 0);
    assert_eq!(batches.len(), again.len());
    for (a, b) in batches.iter().zip(&again) {
        assert_eq!(a.bytes(), b.bytes());
    }
}

#[test]
fn a_config_that_cannot_work_is_refused_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let good = config(Batching::Events(16), 2);
    for (bad, words) in [
        (
            LoaderConfig {
                device_buffers: 1,
                ..good.clone()
            },
            ("device_buffers", "must be at least 2"),
        ),
        (
            LoaderConfig {
                workers: 0,
                ..good.clone()
            },
            ("workers", "must be at least 1"),
        ),
        // Buffers no machine holds (1 MiB each at least): refused before any is allocated,
        // where the pool would have been killed by the kernel for its memory.
        (
            LoaderConfig {
                prefetch: Some(1 << 40),
                ..good.clone()
            },
            ("prefetch", "staging buffers of at least 1 MiB each"),
        ),
        (
            LoaderConfig {
                workers: 1 << 40,
                ..good.clone()
            },
            ("workers", "more than this"),
        ),
        (
            LoaderConfig {
                layout: BatchLayout::Padded {
                    max_doms: 0,
                    pulses_per_dom: 2,
                },
                ..good.clone()
            },
            ("layout", "max_doms of at least 1"),
        ),
        // 4 + 3 x 2^40 features per DOM: one batch is terabytes (the allocator aborted).
        (
            LoaderConfig {
                layout: BatchLayout::Padded {
                    max_doms: 64,
                    pulses_per_dom: 1 << 40,
                },
                ..good.clone()
            },
            (
                "layout",
                "one padded batch (max_doms, pulses_per_dom) needs about",
            ),
        ),
    ] {
        let start = SamplerState::start(0);
        let err = Loader::new(ds.clone(), bad, start).err().unwrap();
        assert!(
            matches!(&err, shardify::Error::Config { field, problem } if *field == words.0 && problem.contains(words.1)),
            "{err}"
        );
    }
}

/// One epoch's batches in `layout` at `window` blocks, gathered with prefetches into the
/// caches of `level` and a columns shard copied in `passes`, hashed section by section
/// (name, dtype, shape and bytes), as a hex digest.
fn epoch_digest(
    ds: &Arc<Dataset>,
    window: usize,
    layout: BatchLayout,
    (level, passes): (PrefetchLevel, ColumnsPasses),
) -> String {
    let mut c = config(Batching::Events(16), 2);
    c.sampler.window_blocks = window;
    c.layout = layout;
    c.prefetch_level = Some(level);
    c.columns_passes = Some(passes);
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for batch in epoch(ds, &c, 1) {
        for s in &batch.sections().list {
            hasher.update(format!("{}:{:?}:{:?};", s.name, s.dtype, s.shape).as_bytes());
            hasher.update(&batch.bytes()[s.offset..s.offset + s.len]);
        }
    }
    format!("{:032x}", hasher.digest128())
}

#[test]
fn batches_are_byte_for_byte_those_of_earlier_releases() {
    // Digests taken at commit 732747f (before the host-path work of issue 20): a faster
    // gather must deliver exactly these bytes. Change them only with a format or sampler
    // change that is meant to change batches, and say so in its commit.
    // Whichever caches the prefetches fill (they are hints) and in however many passes a
    // columns shard is copied, not a byte changes.
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path());
    for level in [PrefetchLevel::L1, PrefetchLevel::L2] {
        for passes in [ColumnsPasses::One, ColumnsPasses::Two] {
            let digests = golden_digests(&ds, (level, passes));
            assert_eq!(digests, GOLDEN_DIGESTS, "{level}, {passes}");
        }
    }
}

#[test]
fn a_records_copy_delivers_the_same_bytes() {
    use shardify::dataset::copy::copy_dataset;
    use shardify::format::ShardLayout;

    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path());
    let records = tmp.path().join("records");
    copy_dataset(
        ds.dir(),
        &records,
        Some(ShardLayout::Records),
        &shardify::convert::Silent,
    )
    .unwrap();
    let records = Arc::new(Dataset::open(&records, ChecksumPolicy::Full).unwrap());
    assert_eq!(records.manifest().schema.layout, ShardLayout::Records);
    for level in [PrefetchLevel::L1, PrefetchLevel::L2] {
        assert_eq!(
            golden_digests(&records, (level, ColumnsPasses::for_this_machine())),
            GOLDEN_DIGESTS,
            "records gave other batches ({level})"
        );
    }
    // Without positions, from one worker, in stored order, and from whole blocks.
    let mut c = config(Batching::Events(16), 1);
    c.dom_positions = false;
    c.sampler.batch_order = BatchOrder::Stored;
    c.sampler.window_blocks = 1;
    c.sampler.run_events = 8;
    let (from_columns, from_records) = (epoch_bytes(&ds, &c, 2), epoch_bytes(&records, &c, 2));
    assert!(!from_columns.is_empty());
    assert!(from_columns == from_records, "records gave other batches");
}

/// One epoch's digest at windows 1, 4 and 64 in the packed layout, and at 4 padded,
/// gathered the `way` given: prefetching into the caches of its level, copying a columns
/// shard in its passes.
fn golden_digests(ds: &Arc<Dataset>, way: (PrefetchLevel, ColumnsPasses)) -> Vec<String> {
    let padded = BatchLayout::Padded {
        max_doms: 24,
        pulses_per_dom: 3,
    };
    [
        (1, BatchLayout::Packed),
        (4, BatchLayout::Packed),
        (64, BatchLayout::Packed),
        (4, padded),
    ]
    .into_iter()
    .map(|(window, layout)| epoch_digest(ds, window, layout, way))
    .collect()
}

const GOLDEN_DIGESTS: [&str; 4] = [
    "7d735e9cfe51091d4ceb60cd3c65c566",
    "255ad040cc67586e5e3b770d2c9b19e4",
    "043abe213c0dde813aab2767f9757405",
    "c858f8937edc89771c7c288f4685b9b4",
];

/// Damaged bytes anywhere in a shard that is read without its checksum (header, offsets,
/// columns, records) are an error naming the shard or harmless values, never a panic or a
/// read outside the file: the open's structure check is all that stands between them and
/// the gather's unchecked copies. 64 seeded cases over both shard layouts and both batch
/// layouts (the same sweep run for 6,400 cases outside the tests: about half refused, none
/// panicked).
#[test]
fn damaged_shard_bytes_read_unchecked_are_an_error_naming_it_or_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let columns = dataset(dir.path());
    let records = dir.path().join("records");
    copy_dataset(columns.dir(), &records, Some(ShardLayout::Records), &Silent).unwrap();
    let mut rng = shardify::rng::Rng::new(11);
    let (mut harmless, mut refused) = (0, 0);
    for case in 0..64 {
        let source = if rng.below(2) == 0 {
            columns.dir()
        } else {
            records.as_path()
        };
        let damaged = dir.path().join(format!("damaged{case}"));
        copy_dataset(source, &damaged, None, &Silent).unwrap();
        let manifest = shardify::format::manifest::Manifest::read(&damaged).unwrap();
        let file = &manifest.shards[rng.below(manifest.shards.len() as u64) as usize].file;
        let path = damaged.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let len = bytes.len();
        damage(&mut bytes, 0..len, &mut rng);
        std::fs::write(&path, &bytes).unwrap();
        let layout = [
            BatchLayout::Packed,
            BatchLayout::Padded {
                max_doms: 64,
                pulses_per_dom: 4,
            },
        ][rng.below(2) as usize];
        let opened = Arc::new(Dataset::open(&damaged, ChecksumPolicy::Off).unwrap());
        let config = LoaderConfig {
            layout,
            ..config(Batching::Events(10), 2)
        };
        let outcome: Result<Vec<Batch>, Error> =
            Loader::new(opened, config, SamplerState::start(0)).and_then(|loader| loader.collect());
        match outcome {
            Ok(batches) => {
                assert_eq!(
                    batches.iter().map(|b| b.plan().events.len()).sum::<usize>(),
                    300
                );
                harmless += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains(file.as_str()), "case {case}: {e}");
                refused += 1;
            }
        }
        std::fs::remove_dir_all(&damaged).unwrap();
    }
    assert!(
        harmless > 0 && refused > 0,
        "{harmless} harmless, {refused} refused"
    );
}
