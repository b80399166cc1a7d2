//! `shardify order`: the event ids of each batch a rank receives, as the loader plans them.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use shardify::batch::BatchLayout;
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::device::DeviceChoice;
use shardify::pipeline::{Loader, LoaderConfig, LoaderState};
use shardify::sampler::{SamplerConfig, SamplerState};

use super::sampler_args::SamplerArgs;

/// `shardify order`'s arguments.
#[derive(Args)]
pub(super) struct OrderArgs {
    /// Dataset directory.
    dataset: PathBuf,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// Epoch.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// This rank.
    #[arg(long, default_value_t = 0)]
    rank: usize,
    /// Number of ranks.
    #[arg(long, default_value_t = 1)]
    world: usize,
    /// Blocks open at once.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Worker threads (the order does not depend on it).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Drop incomplete trailing batches so every rank gets the same count.
    #[arg(long)]
    drop_last: bool,
    /// No shuffle: the stored order, every epoch (evaluation, inference).
    #[arg(long)]
    no_shuffle: bool,
    /// Stop after this many batches.
    #[arg(long)]
    stop_after: Option<u64>,
    /// Write the loader state here when stopping.
    #[arg(long)]
    save_state: Option<PathBuf>,
    /// Continue from a state written by --save-state, at any --world (elastic: this rank
    /// continues from the global position the saved world had reached).
    #[arg(long)]
    resume: Option<PathBuf>,
}

/// Prints one line per batch (its event ids), and saves the loader's state when asked.
pub(super) fn run_order(args: OrderArgs) -> Result<()> {
    let config = LoaderConfig {
        sampler: SamplerConfig {
            seed: args.sampler.seed,
            block_events: args.sampler.block_events,
            window_blocks: args.window,
            run_events: args.sampler.run_events,
            batching: args.sampler.batching(),
            batch_order: args.sampler.batch_order,
            shuffle: !args.no_shuffle,
            group_by_length: args.sampler.length_grouping(),
            drop_last: args.drop_last,
            rank: args.rank,
            world: args.world,
        },
        layout: BatchLayout::Packed,
        workers: args.threads,
        device: DeviceChoice::Cpu,
        ..LoaderConfig::default()
    };
    let dataset = Arc::new(Dataset::open(&args.dataset, ChecksumPolicy::Lazy)?);
    let mut loader = match &args.resume {
        Some(path) => {
            let state: LoaderState = serde_json::from_slice(
                &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
            )
            .with_context(|| format!("{} is not a saved loader state", path.display()))?;
            Loader::resume(dataset, config, &state)?
        }
        None => Loader::new(dataset, config, SamplerState::start(args.epoch))?,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0;
    while args.stop_after.is_none_or(|k| printed < k) {
        let Some(batch) = loader.next() else { break };
        let batch = batch?;
        let ids: Vec<String> = batch
            .packed()
            .expect("packed layout")
            .event_id
            .iter()
            .map(|id| id.to_string())
            .collect();
        writeln!(out, "{}", ids.join(" "))?;
        printed += 1;
    }
    out.flush()?;
    if let Some(path) = &args.save_state {
        let state = serde_json::to_vec_pretty(&loader.state())?;
        shardify::format::atomic::write_bytes_atomic(path, &state)?;
    }
    Ok(())
}
