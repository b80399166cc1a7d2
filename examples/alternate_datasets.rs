//! The loader over two datasets, epochs alternated in one process:
//! `cargo run --release --example alternate_datasets -- A B [WINDOWS] [ROUNDS] [LEVELS]
//! [PASSES]`.
//!
//! For each window (`1,4,16,64` by default), one epoch over A, one over B, and again, for
//! ROUNDS rounds (30 by default; which goes first alternates, and a first round warming
//! both is not counted), on the CPU with the loader's defaults (2 workers, 256-event
//! batches). LEVELS (`l1,l2`, say) sets the caches A's and B's gathers prefetch into
//! (the loader's choice for this machine when left out, or `-`): with A and B the same
//! dataset, it compares the two levels. PASSES (`one,two`, say) sets, the same way, the
//! passes A's and B's gathers copy a columns shard in. Prints each dataset's mean
//! events/s, B's ratio to A, and in how many rounds A was faster, and the same for the
//! rounds whose two vCPUs shared a last-level cache and for those that did not (a
//! cache-line round trip timed before and after each round, as shardbench's rows are
//! placed: `CachePlacement`); then how much of each dataset's shards the process maps in
//! huge pages.
//! Shared machines drift by a quarter from one run to the next; epochs alternated in one
//! process drift together, so this compares two conversions of the same events (two
//! writers, two page-cache states, two filesystems) where whole benchmark runs cannot.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use shardify::batch::ColumnsPasses;
use shardify::bench::hand_off::{cache_line_round_trip_ns, CachePlacement};
use shardify::dataset::huge_pages::shard_mapped_bytes;
use shardify::dataset::{ChecksumPolicy, Dataset};
use shardify::device::staging::StagingPool;
use shardify::device::{DeviceChoice, Placement};
use shardify::pipeline::{Loader, LoaderConfig};
use shardify::prefetch::PrefetchLevel;
use shardify::sampler::{SamplerConfig, SamplerState};

/// Events/s of one epoch over `dataset` at `config`, in `pool`'s staging buffers.
fn epoch_rate(
    dataset: &Arc<Dataset>,
    config: &LoaderConfig,
    epoch: u64,
    placement: &Placement,
    pool: &mut Option<Arc<StagingPool>>,
) -> Result<f64, Box<dyn Error>> {
    let mut loader = Loader::on_pool(
        dataset.clone(),
        config.clone(),
        SamplerState::start(epoch),
        placement.clone(),
        pool.take(),
    )?;
    *pool = Some(loader.staging_pool().clone());
    let started = Instant::now();
    let mut events = 0;
    for batch in loader.by_ref() {
        events += batch?.shape().events;
    }
    Ok(events as f64 / started.elapsed().as_secs_f64())
}

/// A's and B's mean events/s over paired rounds, B's ratio to A, and in how many rounds A
/// was faster.
fn compared(a: &[f64], b: &[f64]) -> String {
    let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len().max(1) as f64;
    let a_faster = a.iter().zip(b).filter(|(x, y)| x > y).count();
    format!(
        "A {:.3}M events/s, B {:.3}M (B/A {:.3}); A faster in {a_faster} of {} rounds",
        mean(a) / 1e6,
        mean(b) / 1e6,
        mean(b) / mean(a).max(1e-12),
        a.len()
    )
}

/// A's and B's settings from `arg`, two comma-separated (`example`); none where `arg` is
/// absent or `-`.
fn pair<T>(
    arg: Option<&String>,
    name: &str,
    example: &str,
) -> Result<[Option<T>; 2], Box<dyn Error>>
where
    T: std::str::FromStr,
    T::Err: Error + 'static,
{
    match arg.map(String::as_str) {
        None | Some("-") => Ok([None, None]),
        Some(values) => match values.split(',').collect::<Vec<_>>()[..] {
            [a, b] => Ok([Some(a.parse()?), Some(b.parse()?)]),
            _ => Err(format!("{name} is two values, as {example}: not {values}").into()),
        },
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(a), Some(b)) = (args.first(), args.get(1)) else {
        return Err("usage: alternate_datasets A B [WINDOWS] [ROUNDS] [LEVELS] [PASSES]".into());
    };
    let windows: Vec<usize> = args
        .get(2)
        .map_or("1,4,16,64", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let rounds: usize = args.get(3).map_or(Ok(30), |r| r.parse())?;
    let levels: [Option<PrefetchLevel>; 2] = pair(args.get(4), "LEVELS", "l1,l2")?;
    let passes: [Option<ColumnsPasses>; 2] = pair(args.get(5), "PASSES", "one,two")?;
    let datasets = [
        Arc::new(Dataset::open(a.as_ref(), ChecksumPolicy::Full)?),
        Arc::new(Dataset::open(b.as_ref(), ChecksumPolicy::Full)?),
    ];
    let placement = Placement::resolve(DeviceChoice::Cpu)?;
    for window in windows {
        let config = LoaderConfig {
            sampler: SamplerConfig {
                window_blocks: window,
                ..SamplerConfig::default()
            },
            device: DeviceChoice::Cpu,
            ..LoaderConfig::default()
        };
        let mut pools: [Option<Arc<StagingPool>>; 2] = [None, None];
        let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut placements: Vec<Option<CachePlacement>> = Vec::new();
        for round in 0..=rounds {
            let round_trip_before = cache_line_round_trip_ns();
            for turn in 0..2 {
                let which = (turn + round) % 2;
                let config = LoaderConfig {
                    prefetch_level: levels[which],
                    columns_passes: passes[which],
                    ..config.clone()
                };
                let rate = epoch_rate(
                    &datasets[which],
                    &config,
                    round as u64,
                    &placement,
                    &mut pools[which],
                )?;
                if round > 0 {
                    rates[which].push(rate);
                }
            }
            if round > 0 {
                let after = cache_line_round_trip_ns();
                placements.push(CachePlacement::from_round_trips(round_trip_before, after));
            }
        }
        println!("window {window}: {}", compared(&rates[0], &rates[1]));
        for placement in [CachePlacement::Shared, CachePlacement::Split] {
            let kept = |r: &[f64]| -> Vec<f64> {
                r.iter()
                    .zip(&placements)
                    .filter(|(_, p)| **p == Some(placement))
                    .map(|(&rate, _)| rate)
                    .collect()
            };
            let (a, b) = (kept(&rates[0]), kept(&rates[1]));
            if !a.is_empty() {
                println!(
                    "  rounds with {}: {}",
                    placement.describe(),
                    compared(&a, &b)
                );
            }
        }
        let unplaced = placements
            .iter()
            .filter(|p| !matches!(p, Some(CachePlacement::Shared | CachePlacement::Split)))
            .count();
        if unplaced > 0 {
            println!("  {unplaced} of {rounds} rounds moved between placements or were not timed");
        }
    }
    for (name, dataset) in ["A", "B"].iter().zip(&datasets) {
        if let Some(huge) = shard_mapped_bytes(dataset).and_then(|m| m.huge_fraction()) {
            println!(
                "{name}: {:.0}% of its mapped shard bytes in huge pages",
                100.0 * huge
            );
        }
    }
    Ok(())
}
