//! `shardbench`: how fast a converted dataset reaches the consumer, beside the Parquet
//! loaders people write, with what each gives up in shuffle quality.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use shardify::batch::ColumnsPasses;
use shardify::bench::report::{run, table, BenchConfig};
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::device::DeviceChoice;
use shardify::pipeline::WorkerScheduling;
use shardify::prefetch::PrefetchLevel;
use shardify::sampler::Batching;
use shardify::source::InputSet;

#[macro_use]
#[path = "common/console.rs"]
mod console;
#[path = "common/sampler_args.rs"]
mod sampler_args;
use sampler_args::SamplerArgs;

/// Throughput, per-stage time and shuffle quality of the shardify loader and of Parquet
/// baselines, in one run.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Converted dataset directory.
    dataset: PathBuf,
    /// Kaggle-layout source of the dataset, for the baselines (default: the files recorded
    /// in the manifest).
    #[arg(long)]
    source: Option<PathBuf>,
    /// Split of --source, when it holds both.
    #[arg(long)]
    split: Option<String>,
    /// Skip the Parquet baselines.
    #[arg(long)]
    no_baselines: bool,
    /// Window sizes (blocks), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    windows: Vec<usize>,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// Gather threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Batches the loader prepares ahead of the consumer (default: the loader's, twice the
    /// workers that can run at once, at most the cores, and at least 4): with batches
    /// delivered in order, they let the workers run ahead of a slow batch, each in a
    /// staging buffer of its own.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    prefetch: Option<u64>,
    /// The caches the loader's prefetches fill, l1 (prefetcht0) or l2 (prefetcht1), for
    /// the loader and for the bounds it is measured against (default: the environment's
    /// SHARDIFY_PREFETCH_LEVEL, else this CPU's level: l2 on AMD family 25, l1 elsewhere).
    #[arg(long)]
    prefetch_level: Option<PrefetchLevel>,
    /// The passes the loader's gather copies a columns shard in, one or two, for the
    /// loader and for the bounds it is measured against; the batches are the same bytes
    /// either way (default: the environment's SHARDIFY_COLUMNS_PASSES, else this CPU's
    /// choice: two on AMD family 25, one elsewhere).
    #[arg(long)]
    columns_passes: Option<ColumnsPasses>,
    /// Scheduling policies of the gather threads, comma-separated: batch (Linux
    /// SCHED_BATCH, the loader's default: no wake-up preemption of the consumer) and/or
    /// normal (the process's policy); each is measured at every window, in this run.
    #[arg(long, value_delimiter = ',', default_value = "batch")]
    worker_scheduling: Vec<WorkerScheduling>,
    /// Whether the thread waiting for the next batch gathers one itself (true, the
    /// loader's default) or sleeps until a worker sends it (false), comma-separated; each
    /// is measured at every window and scheduling policy, in this run.
    #[arg(long, value_delimiter = ',', default_value = "true")]
    consumer_gathers: Vec<bool>,
    /// A training step of this many milliseconds per batch (a sleep on the CPU; on a GPU,
    /// memory-bound work on a compute stream, calibrated to this length).
    #[arg(long, default_value_t = 0.0)]
    simulate_compute: f64,
    /// Decoded files the naive loader caches.
    #[arg(long, default_value_t = 2)]
    naive_cache_files: usize,
    /// Seconds each baseline may run.
    #[arg(long, default_value_t = 20.0)]
    baseline_seconds: f64,
    /// Where batches go: auto (CUDA device 0 when usable), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// On a GPU, also time every copy in the run with CUDA timing events (a diagnostic:
    /// the events cost copy throughput).
    #[arg(long)]
    time_copies: bool,
    /// On a GPU, device buffers the loader keeps busy (at least 2); more hide the host's
    /// latency in reusing a buffer when steps are very short.
    #[arg(long, default_value_t = 2)]
    device_buffers: usize,
    /// Leave `dom_position` out of the batches (models that embed sensor ids, or look
    /// positions up themselves).
    #[arg(long)]
    no_dom_positions: bool,
    /// Evict the shards from the page cache before each measured shardify epoch (no root
    /// needed), and measure a cold sequential read of the shards as the bound.
    #[arg(long)]
    cold: bool,
    /// Measured shardify epochs per window and setting (at least 2), each between two
    /// memcpy measurements: each row also reports every epoch's delivered GB/s over the
    /// memcpy just before and after it, and their median (an odd count gives a plain one).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    epochs: u64,
    /// Small and fast: windows 1 and 4, baselines for 2 s at most.
    #[arg(long)]
    quick: bool,
    /// Write every figure as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw throughput and shuffle quality of every loader here (an .svg file).
    #[arg(long)]
    plot: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    console::log_to_stderr();
    // A closed stdout ends the run quietly with the status `shardify` gives it (141).
    std::process::ExitCode::from(console::exit_status(bench(Args::parse())))
}

/// Batches an epoch under which the figures are the noise of a few batches.
const FEW_BATCHES: u64 = 64;

/// Refuses a dataset with no events (nothing to time), and warns where the figures would
/// not mean what they say: an epoch of a few batches, or a window wider than the dataset
/// (whose rows then measure the narrower window the dataset allows).
fn check_size(dataset: &Dataset, sampler: &SamplerArgs, windows: &[usize]) -> Result<()> {
    let events = dataset.manifest().totals.events;
    anyhow::ensure!(
        events > 0,
        "{}: holds no events, so there is nothing to measure (`shardify-gen --events 320000 \
         --files 8` writes data with the real statistics to convert)",
        dataset.dir().display()
    );
    // A token budget's batches hold about the budget in tokens (counted uncapped here).
    let totals = &dataset.manifest().totals;
    let (batches, of) = match sampler.batching() {
        Batching::Tokens { max_tokens, .. } => {
            let batches = totals
                .of(sampler.length_of)
                .div_ceil(max_tokens.max(1) as u64);
            (batches, format!("about {max_tokens} tokens"))
        }
        // At most the budget's pulses (counted uncapped here: a cap makes fewer batches).
        Batching::Pulses { max_pulses, .. } => {
            let batches = totals.pulses.div_ceil(max_pulses.max(1) as u64);
            (batches, format!("at most {max_pulses} pulses"))
        }
        Batching::Events(n) => (events.div_ceil(n.max(1) as u64), format!("{n} events")),
    };
    if batches < FEW_BATCHES {
        tell!(
            "warning: {events} events make {batches} batches of {of} an epoch: the figures are \
             a few batches' noise (`shardify-gen --events 320000 --files 8` writes data with \
             the real statistics)"
        );
    }
    let widest = windows.iter().copied().max().unwrap_or(1);
    let covered = (widest * sampler.block_events) as u64;
    if covered > events {
        tell!(
            "warning: window {widest} covers {covered} events ({} per block), more than the \
             dataset's {events}: its rows measure the narrower window the dataset holds",
            sampler.block_events
        );
    }
    Ok(())
}

/// The whole run: the report's files, then its table on stdout.
fn bench(args: Args) -> Result<()> {
    if let Some(plot) = &args.plot {
        anyhow::ensure!(
            plot.extension().is_some_and(|e| e == "svg"),
            "--plot writes SVG: give a file name ending in .svg"
        );
    }
    let dataset = Arc::new(Dataset::open(&args.dataset, ChecksumPolicy::Full)?);
    let windows = if args.quick { vec![1, 4] } else { args.windows };
    check_size(&dataset, &args.sampler, &windows)?;
    let source = if args.no_baselines {
        None
    } else if let Some(dir) = &args.source {
        Some(InputSet::discover(dir, args.split.as_deref())?)
    } else {
        let s = &dataset.manifest().sources;
        let inputs = InputSet::from_paths(
            s.batches.iter().map(|b| PathBuf::from(&b.path)).collect(),
            s.meta.iter().map(|m| PathBuf::from(&m.path)).collect(),
            PathBuf::from(&s.geometry.path),
        )
        .context("the source files recorded in the manifest (give --source, or --no-baselines)")?;
        Some(inputs)
    };
    let config = BenchConfig {
        windows,
        batch_events: args.sampler.batch_events,
        batching: args.sampler.batching(),
        block_events: args.sampler.block_events,
        run_events: args.sampler.run_events,
        batch_order: args.sampler.batch_order,
        group_by_length: args.sampler.length_grouping(),
        workers: args.workers,
        prefetch: args.prefetch.map(|n| n as usize),
        worker_scheduling: args.worker_scheduling,
        consumer_gathers: args.consumer_gathers,
        seed: args.sampler.seed,
        simulate_compute_ms: args.simulate_compute,
        naive_cache_files: args.naive_cache_files,
        baseline_seconds: if args.quick {
            args.baseline_seconds.min(2.0)
        } else {
            args.baseline_seconds
        },
        device: args.device,
        time_copies: args.time_copies,
        device_buffers: args.device_buffers,
        dom_positions: !args.no_dom_positions,
        cold: args.cold,
        epochs: args.epochs as usize,
        prefetch_level: args.prefetch_level,
        columns_passes: args.columns_passes,
    };
    let report = run(dataset, source.as_ref(), &config)?;
    // The files first: a run of minutes is not lost when stdout's reader has gone
    // (`shardbench DS --json F | head`), which `print!` would panic on.
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, shardify::bench::plot::svg(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    std::io::stdout()
        .write_all(table(&report).as_bytes())
        .context("writing the report to stdout")
}
