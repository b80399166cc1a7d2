//! `shardify convert`: its arguments, and the run that reports what it did.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use shardify::convert::{convert, ConvertOptions, Phase};
use shardify::source::InputSet;

use super::job_array::{print_array_lines, task_slice};
use super::progress::Reporter;
use super::LayoutArg;

/// `--phase`: which phase of a conversion to run.
#[derive(Clone, Copy, ValueEnum)]
enum PhaseArg {
    All,
    Plan,
    Scatter,
    Gather,
    Finalize,
}

/// `shardify convert`'s arguments.
#[derive(Args)]
pub(super) struct ConvertArgs {
    /// `INPUT OUT`: the Kaggle-layout input directory (train/ or test/, *_meta.parquet,
    /// sensor_geometry.csv) and the output dataset directory (created; must be empty or an
    /// unfinished conversion); with --batch, --meta and --geometry only `OUT`.
    #[arg(value_names = ["INPUT", "OUT"], num_args = 1..=2, required = true)]
    pub(super) paths: Vec<PathBuf>,
    /// Split to convert when the input holds both train/ and test/.
    #[arg(long)]
    pub(super) split: Option<String>,
    /// Explicit batch files (batch_N.parquet), instead of an input directory.
    #[arg(long = "batch", num_args = 1..)]
    batches: Vec<PathBuf>,
    /// Explicit meta files, with --batch.
    #[arg(long = "meta", num_args = 1..)]
    meta: Vec<PathBuf>,
    /// Explicit sensor_geometry.csv, with --batch.
    #[arg(long)]
    geometry: Option<PathBuf>,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker threads (the output does not depend on it).
    #[arg(long)]
    threads: Option<usize>,
    /// Memory bound, e.g. 2GiB, 512MiB (it can lower the shard size).
    #[arg(long, default_value = "4GiB", value_parser = parse_size)]
    memory_limit: u64,
    /// Target shard size, e.g. 256MiB.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    shard_size: u64,
    /// Narrow charge and positions to f32 even where values change.
    #[arg(long)]
    lossy: bool,
    /// Shard layout: `columns` (plain safetensors arrays) or `records` (each event's pieces
    /// side by side: faster to load at random, see docs/format.md).
    #[arg(long, value_enum, default_value = "columns")]
    layout: LayoutArg,
    /// Phase to run (for job arrays); all by default.
    #[arg(long, value_enum, default_value = "all")]
    phase: PhaseArg,
    /// This task's index in a job array (scatter and gather phases); inside a Slurm array,
    /// taken from SLURM_ARRAY_TASK_ID (less SLURM_ARRAY_TASK_MIN, over its step) by default.
    #[arg(long)]
    pub(super) task_index: Option<u64>,
    /// Number of tasks in the job array; inside a Slurm array, SLURM_ARRAY_TASK_COUNT by
    /// default (giving it there too is checked against the array).
    #[arg(long)]
    pub(super) task_count: Option<u64>,
    /// Also write the run's figures as JSON here (peak memory, bytes written, seconds per
    /// phase), for scripts and benches.
    #[arg(long)]
    summary: Option<PathBuf>,
}

impl ConvertArgs {
    /// The input directory, when two paths were given.
    pub(super) fn input(&self) -> Option<&PathBuf> {
        (self.paths.len() == 2).then(|| &self.paths[0])
    }

    /// The output directory: the last path.
    pub(super) fn out(&self) -> &PathBuf {
        self.paths.last().expect("clap requires one path at least")
    }
}

/// Parses `123`, `64KiB`, `512MiB`, `4GiB`, `1TiB` (also KB/MB/GB/K/M/G as powers of 1024).
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 512MiB"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    Ok((number * scale as f64) as u64)
}

/// Runs `shardify convert` (a phase of it, for job arrays) and prints what it did.
pub(super) fn run_convert(args: ConvertArgs) -> Result<()> {
    let inputs = match (args.input(), args.batches.is_empty()) {
        (Some(dir), true) => InputSet::discover(dir, args.split.as_deref())?,
        (None, false) => InputSet::from_paths(
            args.batches.clone(),
            args.meta.clone(),
            args.geometry
                .clone()
                .context("--geometry is required with --batch")?,
        )?,
        (Some(_), false) => bail!(
            "give an input directory or --batch files, not both (with --batch, the only \
             path is OUT)"
        ),
        (None, true) => {
            bail!("give an input directory before OUT, or --batch, --meta and --geometry")
        }
    };
    let mut options = ConvertOptions {
        seed: args.seed,
        memory_limit_bytes: args.memory_limit,
        shard_target_bytes: args.shard_size,
        lossy: args.lossy,
        layout: args.layout.into(),
        ..ConvertOptions::default()
    };
    if let Some(threads) = args.threads {
        options.threads = threads;
    }
    if let Some(available) = shardify::device::memory::available() {
        if options.memory_limit_bytes > available.bytes {
            tell!(
                "warning: --memory-limit {} MiB is more than {what} ({} MiB): the \
                 conversion may be killed before it reaches its limit; give at most that",
                options.memory_limit_bytes >> 20,
                available.bytes >> 20,
                what = available.limited_by
            );
        }
    }
    let phase = match args.phase {
        PhaseArg::All => Phase::All,
        PhaseArg::Plan => Phase::Plan,
        PhaseArg::Scatter => Phase::Scatter,
        PhaseArg::Gather => Phase::Gather,
        PhaseArg::Finalize => Phase::Finalize,
    };
    let slice = task_slice(&args, phase)?;
    let reporter = Reporter::new();
    let started = Instant::now();
    let summary = convert(&inputs, args.out(), &options, phase, slice, &reporter)
        .with_context(|| format!("converting into {}", args.out().display()))?;
    let elapsed = started.elapsed().as_secs_f64();
    for (phase, units) in &summary.units_run {
        let seconds = summary
            .seconds
            .iter()
            .find(|(p, _)| p == phase)
            .map_or(0.0, |s| s.1);
        tell!("{phase}: ran {units} units in {seconds:.2} s");
    }
    if summary.units_skipped > 0 {
        tell!(
            "skipped {} units finished by an earlier run",
            summary.units_skipped
        );
    }
    match &summary.manifest {
        Some(m) if summary.already_complete => {
            say!(
                "{} is already complete: {} events in {} shards",
                args.out().display(),
                m.totals.events,
                m.shards.len()
            )?;
        }
        Some(m) => {
            let rate = summary.pulses_scattered as f64 / elapsed / 1e6;
            // A resumed run read only what the earlier ones left: its rate is over those.
            let rate = if summary.pulses_scattered == m.totals.pulses {
                format!("{rate:.2} M input pulses/s")
            } else if summary.pulses_scattered == 0 {
                "every pulse read by earlier runs".into()
            } else {
                format!(
                    "{rate:.2} M input pulses/s over the {} pulses this run read; earlier runs read the rest",
                    summary.pulses_scattered
                )
            };
            say!(
                "converted {} events, {} DOMs, {} pulses into {} shards, {:.1} MiB, in {:.2} s ({rate})",
                m.totals.events,
                m.totals.doms,
                m.totals.pulses,
                m.shards.len(),
                m.totals.bytes as f64 / (1 << 20) as f64,
                elapsed,
            )?
        }
        None => say!("phase done in {elapsed:.2} s")?,
    }
    if let (Phase::Plan, Some(units)) = (phase, summary.planned) {
        print_array_lines(&inputs, &args, &options, units)?;
    }
    let peak = peak_memory_bytes();
    if let Some(peak) = peak {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        say!(
            "peak memory: {:.1} MiB (limit {:.1} MiB)",
            mib(peak),
            mib(options.memory_limit_bytes)
        )?;
        if peak > options.memory_limit_bytes {
            tracing::warn!(
                "the peak memory exceeded --memory-limit by {:.1} MiB: a job whose memory \
                 is capped there (Slurm's --mem) could have been killed",
                mib(peak - options.memory_limit_bytes)
            );
        }
    }
    if let Some(path) = &args.summary {
        let figures = serde_json::json!({
            "seconds": elapsed,
            "peak_memory_bytes": peak,
            "memory_limit_bytes": options.memory_limit_bytes,
            "pulses_scattered": summary.pulses_scattered,
            "spill_bytes": summary.spill_bytes,
            "output_bytes": summary.manifest.as_ref().map(|m| m.totals.bytes + m.sensor_table.bytes),
            "units_run": summary.units_run,
            "units_skipped": summary.units_skipped,
            "phase_seconds": summary.seconds,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&figures)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// This process's peak resident memory in bytes (`VmHWM`; unlike `ru_maxrss`, it does not
/// include the parent's memory from before `exec`).
fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
