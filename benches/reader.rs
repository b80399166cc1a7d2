//! Reader throughput on the CPU path against memcpy of the same bytes, in one run.
//!
//! `cargo bench --bench reader -- [--events N] [--workers W] [--batch B] [--run-events K]`
//!
//! Converts a generated dataset with the real data's statistics once (kept under
//! target/bench-data, or `SHARDIFY_BENCH_DATA`), then runs shardbench's loader measurement
//! on it: two whole epochs per window size (1, 4, 16, 64), each against memcpy of
//! batch-sized pieces of the same shard bytes with the same threads, without baselines.

use std::sync::Arc;

use shardify::bench::data;
use shardify::bench::report::{run, table, BenchConfig};
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::device::DeviceChoice;
use shardify::pipeline::WorkerScheduling;
use shardify::sampler::{BatchOrder, Batching, LengthGrouping};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn main() {
    let events = arg("--events", 1_000_000);
    let dir = data::converted(&data::root(), events, 8).unwrap();
    let dataset = Arc::new(Dataset::open(&dir, ChecksumPolicy::Full).unwrap());
    let batch_events = arg("--batch", 256) as usize;
    let config = BenchConfig {
        consumer_gathers: vec![true],
        windows: vec![1, 4, 16, 64],
        batch_events,
        batching: Batching::Events(batch_events),
        block_events: 256,
        run_events: arg("--run-events", 1) as usize,
        batch_order: BatchOrder::Stored,
        group_by_length: LengthGrouping::Off,
        workers: arg("--workers", 2) as usize,
        prefetch: None,
        worker_scheduling: vec![WorkerScheduling::Batch],
        seed: 9,
        simulate_compute_ms: 0.0,
        naive_cache_files: 0,
        baseline_seconds: 0.0,
        device: DeviceChoice::Cpu,
        time_copies: false,
        device_buffers: 2,
        dom_positions: true,
        cold: false,
        epochs: 2,
        prefetch_level: None,
        columns_passes: None,
    };
    print!("{}", table(&run(dataset, None, &config).unwrap()));
}
