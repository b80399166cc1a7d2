//! Micro benches of the hot paths, each with its throughput in bytes (events for a split):
//! DOM packing, gathering a batch from mapped shards (random events, and whole epochs of
//! block-shuffled batches), the checksum, and a split's making, locating and lengths.
//!
//! `cargo bench --bench hot_paths`

use std::hint::black_box;
use std::sync::Arc;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use shardify::batch::{plan_sections, BatchLayout, Gatherer};
use shardify::dataset::{ChecksumPolicy, Dataset, DatasetSizes, View};
use shardify::device::staging::{HostMemory, PlainMemory};
use shardify::event::{EventHeader, RawEvent};
use shardify::format::checksum;
use shardify::pack::{PackedColumns, Packer};
use shardify::rng::Rng;
use shardify::sampler::{
    BatchPlan, Batching, EpochBatches, EventLength, EventRef, EventSizes, SamplerConfig,
    SamplerState,
};
use shardify::synth::{generate_batch, Profile};

/// Bytes of the pulse columns DOM packing reads (sensor, time, charge, auxiliary).
const PULSE_BYTES: u64 = 4 + 8 + 8 + 1;

fn packing(c: &mut Criterion) {
    let mut next = 0;
    let (table, meta) = generate_batch(
        &mut Rng::new(1),
        1,
        2000,
        &mut next,
        false,
        Profile::default(),
    );
    let events: Vec<RawEvent> = (0..meta.event_id.len())
        .map(|m| {
            let r = meta.first_pulse_index[m] as usize..meta.last_pulse_index[m] as usize + 1;
            RawEvent {
                header: Some(EventHeader {
                    event_id: meta.event_id[m],
                    batch_id: 1,
                    first_row: r.start as u64,
                    azimuth: f64::NAN,
                    zenith: f64::NAN,
                }),
                sensor_id: table.sensor_id[r.clone()]
                    .iter()
                    .map(|&s| s as i32)
                    .collect(),
                time: table.time[r.clone()].to_vec(),
                charge: table.charge[r.clone()].to_vec(),
                auxiliary: table.auxiliary[r].iter().map(|&a| a as u8).collect(),
            }
        })
        .collect();
    let pulses: u64 = events.iter().map(|e| e.len() as u64).sum();
    let mut group = c.benchmark_group("pack");
    group.throughput(Throughput::Bytes(pulses * PULSE_BYTES));
    let (mut packer, mut out) = (Packer::default(), PackedColumns::default());
    group.bench_function("2000 events, time-sorted source", |b| {
        b.iter(|| {
            out.clear();
            for e in &events {
                packer.pack(e.pulses(), &mut out);
            }
            black_box(&out);
        })
    });
    group.finish();
}

/// Events per shard; the sampler needs no pulse counts to batch by events.
struct ShardSizes(Vec<usize>);

impl EventSizes for ShardSizes {
    fn shard_events(&self) -> Vec<usize> {
        self.0.clone()
    }

    fn pulses(&self, _: EventRef) -> usize {
        unreachable!("batches by event count")
    }

    fn doms(&self, _: EventRef) -> usize {
        unreachable!("batches not grouped by length")
    }
}

/// Gathers `plans` into one reused buffer, as a loader worker does: the shape pass (which
/// locates each event), then the gather.
fn bench_gather(
    group: &mut BenchmarkGroup<'_, WallTime>,
    dataset: &Dataset,
    name: &str,
    plans: &[BatchPlan],
) {
    let types = dataset.manifest().schema.types;
    let mut gatherer = Gatherer::new(dataset);
    let sections: Vec<_> = plans
        .iter()
        .map(|p| {
            plan_sections(
                BatchLayout::Packed,
                gatherer.shape(p).unwrap(),
                &types,
                true,
            )
        })
        .collect();
    let bytes: usize = sections.iter().map(|s| s.payload_bytes()).sum();
    let mut buffer = PlainMemory::new(sections.iter().map(|s| s.total).max().unwrap());
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function(format!("{name}, packed (shape + gather)"), |b| {
        b.iter(|| {
            for (plan, s) in plans.iter().zip(&sections) {
                black_box(gatherer.shape(plan).unwrap());
                gatherer
                    .gather(plan, BatchLayout::Packed, s, buffer.bytes_mut())
                    .unwrap();
            }
            black_box(buffer.bytes());
        })
    });
}

fn gather_and_checksum(c: &mut Criterion) {
    let dir = shardify::bench::data::converted(&shardify::bench::data::root(), 50_000, 2).unwrap();
    let dataset = Arc::new(Dataset::open(&dir, ChecksumPolicy::Full).unwrap());
    let events = dataset.manifest().shards[0].events as u32;
    let mut rng = Rng::new(3);
    let random: Vec<BatchPlan> = (0..64)
        .map(|k| BatchPlan {
            global_index: k,
            events: (0..256)
                .map(|_| EventRef {
                    shard: 0,
                    index: rng.below(events as u64) as u32,
                })
                .collect(),
        })
        .collect();
    let mut group = c.benchmark_group("gather");
    bench_gather(
        &mut group,
        &dataset,
        "64 batches of 256 random events",
        &random,
    );
    let sizes = ShardSizes(
        dataset
            .manifest()
            .shards
            .iter()
            .map(|s| s.events as usize)
            .collect(),
    );
    for window in [1, 16] {
        let config = SamplerConfig {
            seed: 4,
            block_events: 256,
            window_blocks: window,
            batching: Batching::Events(256),
            ..SamplerConfig::default()
        };
        let plans: Vec<BatchPlan> =
            EpochBatches::new(&sizes, &config, SamplerState::start(0)).collect();
        let name = format!(
            "an epoch ({} batches of 256), blocks of 256, window {window}",
            plans.len()
        );
        bench_gather(&mut group, &dataset, &name, &plans);
    }
    group.finish();
    let shard = dataset.shard(0).unwrap().bytes();
    let mut group = c.benchmark_group("checksum");
    group.throughput(Throughput::Bytes(shard.len() as u64));
    group.bench_function("xxh3 of one shard", |b| {
        b.iter(|| black_box(checksum::of_bytes(shard)))
    });
    group.finish();
}

/// A view's events in blocks of 256, the blocks in a scrambled order (a window's).
fn view_blocks(view: &View) -> Vec<EventRef> {
    let mut blocks = Vec::new();
    for (shard, counts) in view.shard_counts().iter().enumerate() {
        for start in (0..counts.events as u32).step_by(256) {
            blocks.push((shard as u32, start..(start + 256).min(counts.events as u32)));
        }
    }
    blocks.sort_by_key(|(shard, run)| (run.start ^ shard).wrapping_mul(2_654_435_761));
    let event =
        |(shard, run): (u32, std::ops::Range<u32>)| run.map(move |index| EventRef { shard, index });
    blocks.into_iter().flat_map(event).collect()
}

fn split_views(c: &mut Criterion) {
    let dir = shardify::bench::data::converted(&shardify::bench::data::root(), 50_000, 2).unwrap();
    let whole = View::from(Arc::new(Dataset::open(&dir, ChecksumPolicy::Lazy).unwrap()));
    let mut group = c.benchmark_group("split");
    group.throughput(Throughput::Elements(whole.totals().events));
    group.bench_function("split(0.01) of every event", |b| {
        b.iter(|| black_box(whole.split(0.01, 1).unwrap()))
    });
    let (most, few) = whole.split(0.01, 1).unwrap();
    let (ninety_seven, _) = whole.split(0.03, 1).unwrap();
    let (ninety, ten) = whole.split(0.1, 1).unwrap();
    let (half, _) = whole.split(0.5, 1).unwrap();
    for (name, view) in [
        ("every event", &whole),
        ("99% (the left-out 1% listed)", &most),
        ("1% (listed)", &few),
        ("97% (the left-out 3% listed)", &ninety_seven),
        ("90% (a bit an event)", &ninety),
        ("50% (a bit an event)", &half),
        ("10% (a bit an event)", &ten),
    ] {
        let events = view_blocks(view);
        group.throughput(Throughput::Elements(events.len() as u64));
        group.bench_function(format!("locate, blocks of 256, {name}"), |b| {
            let mut located = events.clone();
            b.iter(|| {
                located.copy_from_slice(&events);
                view.locate_all(&mut located);
                black_box(&located);
            })
        });
        let sizes = DatasetSizes::without_read_ahead(view);
        group.bench_function(format!("pulses, blocks of 256, {name}"), |b| {
            let mut lengths = Vec::with_capacity(events.len());
            b.iter(|| {
                lengths.clear();
                sizes.lengths_into(&events, EventLength::Pulses, &mut lengths);
                black_box(&lengths);
            })
        });
        // Drawn one by one, as a window over the whole dataset draws them, and read 256 at
        // a time, as its pulse budget reads them.
        let mut alone = events;
        Rng::new(3).shuffle(&mut alone);
        group.bench_function(format!("pulses, each event alone, {name}"), |b| {
            let mut lengths = Vec::with_capacity(alone.len());
            b.iter(|| {
                lengths.clear();
                for piece in alone.chunks(256) {
                    sizes.lengths_into(piece, EventLength::Pulses, &mut lengths);
                }
                black_box(&lengths);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, packing, gather_and_checksum, split_views);
criterion_main!(benches);
