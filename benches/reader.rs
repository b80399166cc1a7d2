//! Reader throughput on the CPU path against memcpy of the same bytes, in one run.
//!
//! `cargo bench --bench reader -- [--events N] [--workers W] [--batch B] [--run-events K] [--runs R]`
//!
//! Converts a generated dataset once (kept under target/bench-data), warms the page cache,
//! then for each window size streams whole epochs (packed layout) and reports events/s,
//! pulses/s and delivered GB/s (batch payload bytes), beside memcpy GB/s measured with the
//! same number of threads on the same shard bytes into reused buffers of the batch size.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use shardify::batch::BatchLayout;
use shardify::bench::{median, memcpy_gb_per_s};
use shardify::convert::{convert, ConvertOptions, Phase, Silent, TaskSlice};
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::device::DeviceChoice;
use shardify::pipeline::{Loader, LoaderConfig};
use shardify::sampler::{Batching, SamplerConfig, SamplerState};
use shardify::source::InputSet;
use shardify::synth::{write_dataset, SynthOptions};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn prepare(events: u64) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-data");
    let src = root.join(format!("kaggle-{events}-8"));
    if !src.join("train_meta.parquet").exists() {
        write_dataset(
            &src,
            &SynthOptions {
                events,
                files: 8,
                seed: 1,
                ..SynthOptions::default()
            },
        )
        .unwrap();
    }
    let shards = root.join(format!("shards-{events}"));
    if !shards.join("manifest.json").exists() {
        let _ = std::fs::remove_dir_all(&shards);
        let inputs = InputSet::discover(&src, Some("train")).unwrap();
        let options = ConvertOptions {
            seed: 1,
            ..ConvertOptions::default()
        };
        convert(
            &inputs,
            &shards,
            &options,
            Phase::All,
            TaskSlice::default(),
            &Silent,
        )
        .unwrap();
    }
    shards
}

fn main() {
    let events = arg("--events", 1_000_000);
    let workers = arg("--workers", 2) as usize;
    let batch = arg("--batch", 256) as usize;
    let runs = arg("--runs", 3) as usize;
    let run = arg("--run-events", 1) as usize;
    let dir = prepare(events);
    let dataset = Arc::new(Dataset::open(&dir, ChecksumPolicy::Full).unwrap());
    let total_bytes: u64 = dataset.manifest().totals.bytes;
    // Warm the page cache and take the memcpy source from the shards themselves.
    let mut source = Vec::new();
    for i in 0..dataset.shard_count() {
        let bytes = dataset.shard(i).unwrap().bytes();
        std::hint::black_box(bytes.iter().step_by(4096).map(|&b| b as u64).sum::<u64>());
        if source.len() < 1 << 30 {
            source.extend_from_slice(&bytes[..bytes.len().min((1 << 30) - source.len())]);
        }
    }
    println!(
        "dataset       {} events, {} pulses, {:.0} MiB in {} shards",
        dataset.manifest().totals.events,
        dataset.manifest().totals.pulses,
        total_bytes as f64 / 1048576.0,
        dataset.shard_count()
    );
    println!("loader        packed layout, {batch} events per batch, block 256 events, runs of {run} events, {workers} workers");
    println!(
        "{:>7} {:>12} {:>13} {:>10} {:>10} {:>9}",
        "window", "events/s", "pulses/s", "GB/s", "memcpy", "ratio"
    );
    for window in [1usize, 4, 16, 64] {
        let config = LoaderConfig {
            sampler: SamplerConfig {
                seed: 9,
                block_events: 256,
                window_blocks: window,
                run_events: run,
                batching: Batching::Events(batch),
                ..SamplerConfig::default()
            },
            layout: BatchLayout::Packed,
            workers,
            prefetch: 4,
            device: DeviceChoice::Cpu,
            ..LoaderConfig::default()
        };
        let (mut rates, mut copies) = (Vec::new(), Vec::new());
        let (mut ev, mut pu, mut by) = (0usize, 0usize, 0usize);
        for run in 0..runs {
            let started = Instant::now();
            let (mut e, mut p, mut b) = (0, 0, 0);
            let mut chunk = 0;
            for item in Loader::new(
                dataset.clone(),
                config.clone(),
                SamplerState {
                    epoch: run as u64,
                    batches_taken: 0,
                },
            )
            .unwrap()
            {
                let item = item.unwrap();
                e += item.plan().events.len();
                p += item.shape().pulses;
                b += item.sections().payload_bytes();
                chunk = chunk.max(item.sections().total);
            }
            let secs = started.elapsed().as_secs_f64();
            rates.push(b as f64 / secs / 1e9);
            (ev, pu, by) = (e, p, b);
            copies.push(memcpy_gb_per_s(&source, chunk.max(4096), workers));
            let _ = secs;
        }
        let gb = median(&rates);
        let seconds = by as f64 / 1e9 / gb;
        let memcpy = median(&copies);
        println!(
            "{window:>7} {:>12.0} {:>13.0} {:>10.2} {:>10.2} {:>9.2}",
            ev as f64 / seconds,
            pu as f64 / seconds,
            gb,
            memcpy,
            gb / memcpy
        );
    }
}
