//! `shardify`: convert Kaggle IceCube Parquet into pre-shuffled DOM-packed shards, and
//! inspect, dump or verify the result.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use shardify::batch::BatchLayout;
use shardify::convert::{convert, ConvertOptions, Phase, Progress, TaskSlice};
use shardify::dataset::copy::{copy_dataset_with, CopyOptions, CopyOutcome};
use shardify::dataset::{
    dump::dump, inspect::inspect, verify::verify, ChecksumPolicy, Dataset, View,
};
use shardify::device::DeviceChoice;
use shardify::format::ShardLayout;
use shardify::pipeline::{Loader, LoaderConfig, LoaderState};
use shardify::sampler::{Batching, SamplerConfig, SamplerState};
use shardify::source::InputSet;

#[macro_use]
#[path = "common/console.rs"]
pub(crate) mod console;
#[path = "common/sampler_args.rs"]
mod sampler_args;
use sampler_args::SamplerArgs;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "shardify",
    version,
    about = "Pre-shuffled, DOM-packed tensor shards from IceCube Kaggle Parquet files"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert a Kaggle-layout directory (or explicit files) into a dataset directory.
    Convert(ConvertArgs),
    /// Print counts, distributions, sizes, seed and schema of a dataset.
    Inspect {
        /// Dataset directory.
        dataset: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print every event as one JSON line, in stored order.
    Dump {
        /// Dataset directory.
        dataset: PathBuf,
        /// Only this event.
        #[arg(long)]
        event: Option<i64>,
    },
    /// Print, one line per batch, the event ids a rank receives, in order.
    Order(OrderArgs),
    /// Copy a dataset to another directory (a node's local disk), checking every file's
    /// checksum on the way; the copy is cached in huge pages where `cp`'s is not. Run
    /// again, it finds the copy there or finishes a stopped one; it waits for another copy
    /// into the same directory.
    Copy {
        /// Dataset directory to copy.
        dataset: PathBuf,
        /// New directory (absent or empty), or one this copy was made or stopped in.
        destination: PathBuf,
        /// Write the shards in this layout: `records` stores each event's pieces side by
        /// side (faster to load at random, but its DOM and pulse data are no longer plain
        /// safetensors arrays), `columns` as `convert` writes them. Default: the source's.
        #[arg(long, value_enum)]
        layout: Option<LayoutArg>,
        /// With the copy finished in DESTINATION already, read every file and compare it
        /// with the manifest's checksum, copying again the ones that differ or are missing
        /// (reads the whole copy; without it a finished copy is checked by its files'
        /// sizes).
        #[arg(long)]
        check: bool,
    },
    /// Check checksums and every invariant; with --against, compare with the source.
    Verify {
        /// Dataset directory.
        dataset: PathBuf,
        /// Kaggle-layout source directory to compare every pulse with.
        #[arg(long)]
        against: Option<PathBuf>,
        /// Split of the source directory, when it holds both.
        #[arg(long)]
        split: Option<String>,
    },
}

#[derive(Args)]
struct OrderArgs {
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
    /// Batch by a pulse budget instead of an event count.
    #[arg(long, group = "budget", conflicts_with_all = ["batch_events", "group_by_length"])]
    max_pulses: Option<usize>,
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

impl ConvertArgs {
    /// The input directory, when two paths were given.
    fn input(&self) -> Option<&PathBuf> {
        (self.paths.len() == 2).then(|| &self.paths[0])
    }

    /// The output directory: the last path.
    fn out(&self) -> &PathBuf {
        self.paths.last().expect("clap requires one path at least")
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LayoutArg {
    Columns,
    Records,
}

impl From<LayoutArg> for ShardLayout {
    fn from(layout: LayoutArg) -> ShardLayout {
        match layout {
            LayoutArg::Columns => ShardLayout::Columns,
            LayoutArg::Records => ShardLayout::Records,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum PhaseArg {
    All,
    Plan,
    Scatter,
    Gather,
    Finalize,
}

#[derive(Args)]
struct ConvertArgs {
    /// `INPUT OUT`: the Kaggle-layout input directory (train/ or test/, *_meta.parquet,
    /// sensor_geometry.csv) and the output dataset directory (created; must be empty or an
    /// unfinished conversion); with --batch, --meta and --geometry only `OUT`.
    #[arg(value_names = ["INPUT", "OUT"], num_args = 1..=2, required = true)]
    paths: Vec<PathBuf>,
    /// Split to convert when the input holds both train/ and test/.
    #[arg(long)]
    split: Option<String>,
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
    task_index: Option<u64>,
    /// Number of tasks in the job array; inside a Slurm array, SLURM_ARRAY_TASK_COUNT by
    /// default (giving it there too is checked against the array).
    #[arg(long)]
    task_count: Option<u64>,
    /// Also write the run's figures as JSON here (peak memory, bytes written, seconds per
    /// phase), for scripts and benches.
    #[arg(long)]
    summary: Option<PathBuf>,
}

/// After the plan phase: the units of each phase, and the job-array lines that cover them
/// with absolute paths and the resources the options ask for.
fn print_array_lines(
    inputs: &InputSet,
    args: &ConvertArgs,
    options: &ConvertOptions,
    units: shardify::convert::PlannedUnits,
) -> Result<()> {
    say!(
        "planned: {} scatter units (one per batch file), {} gather units (one per bucket); \
         the meta {}",
        units.scatter,
        units.gather,
        if units.meta_split {
            "is split by batch"
        } else {
            "is read per batch"
        }
    )?;
    let exe = std::env::current_exe().context("the path of this shardify binary")?;
    let out = std::path::absolute(args.out())?;
    let source = match args.input() {
        Some(dir) => std::path::absolute(dir)?.display().to_string(),
        None => format!(
            "--batch {} --meta {} --geometry {}",
            inputs
                .batches
                .iter()
                .map(|b| b.path.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            inputs
                .meta
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            inputs.geometry.display()
        ),
    };
    let mut common = format!(
        "--seed {} --threads {} --memory-limit {}MiB --shard-size {}",
        options.seed,
        options.threads_within_limit(),
        options.memory_limit_bytes >> 20,
        options.shard_target_bytes
    );
    if let Some(split) = &args.split {
        common += &format!(" --split {split}");
    }
    if options.lossy {
        common += " --lossy";
    }
    if options.layout == ShardLayout::Records {
        common += " --layout records";
    }
    let convert = format!(
        "{} convert {source} {} {common}",
        exe.display(),
        out.display()
    );
    // Peak RSS stays within --memory-limit; a tenth more for the page tables and the
    // allocator's slack that a job's memory accounting also counts.
    let resources = format!(
        "--cpus-per-task={} --mem={}M",
        options.threads_within_limit(),
        (options.memory_limit_bytes >> 20) * 11 / 10
    );
    say!("submit (each array task takes its index and the array's size from Slurm):")?;
    say!(
        "  scatter=$(sbatch --parsable --array=0-{} {resources} --wrap \"{convert} --phase scatter\")",
        units.scatter.saturating_sub(1)
    )?;
    say!(
        "  gather=$(sbatch --parsable --dependency=afterok:$scatter --array=0-{} {resources} --wrap \"{convert} --phase gather\")",
        units.gather.saturating_sub(1)
    )?;
    say!(
        "  sbatch --dependency=afterok:$gather {resources} --wrap \"{convert} --phase finalize\""
    )?;
    Ok(())
}

/// A Slurm array variable, when set.
fn slurm(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Ok(v) => {
            Ok(Some(v.trim().parse().with_context(|| {
                format!("{name}={v:?} is not a task number")
            })?))
        }
        Err(_) => Ok(None),
    }
}

/// This task's slice of a phase's units: from `--task-index`/`--task-count`, else from the
/// Slurm array the task runs in. A count that disagrees with the array would leave units
/// that no task runs: refused before any work, naming them.
fn task_slice(args: &ConvertArgs, phase: Phase) -> Result<TaskSlice> {
    let in_array = matches!(phase, Phase::Scatter | Phase::Gather);
    let array_count = if in_array {
        slurm("SLURM_ARRAY_TASK_COUNT")?
    } else {
        None
    };
    let array_index = match (in_array, slurm("SLURM_ARRAY_TASK_ID")?) {
        (true, Some(id)) => {
            let min = slurm("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let step = slurm("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
            Some(id.saturating_sub(min) / step)
        }
        _ => None,
    };
    let count = args.task_count.or(array_count).unwrap_or(1);
    if let Some(array) = array_count.filter(|&a| a != count) {
        let left_over: Vec<u64> = (array..count).take(8).collect();
        bail!(
            "--task-count {count} but this Slurm array has {array} tasks \
             (SLURM_ARRAY_TASK_COUNT): the units whose number modulo {count} is {}{} would \
             never run; omit --task-count inside an array, or submit --array=0-{}",
            left_over
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if count - array > 8 { ", ..." } else { "" },
            count.saturating_sub(1)
        );
    }
    Ok(TaskSlice {
        index: args.task_index.or(array_index).unwrap_or(0),
        count,
    })
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

/// Progress bars on a terminal, log lines otherwise.
struct Reporter {
    bar: Mutex<Option<ProgressBar>>,
    terminal: bool,
    state: Mutex<(&'static str, u64, u64, Instant)>,
}

impl Reporter {
    /// A bar on a terminal stderr, log lines otherwise.
    fn new() -> Reporter {
        Reporter {
            bar: Mutex::new(None),
            terminal: std::io::stderr().is_terminal(),
            state: Mutex::new(("", 0, 0, Instant::now())),
        }
    }
}

impl Progress for Reporter {
    fn begin(&self, phase: &'static str, units: u64) {
        *self.state.lock().unwrap() = (phase, units, 0, Instant::now());
        if self.terminal {
            let bar = ProgressBar::new(units);
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>8} [{bar:40}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(phase);
            *self.bar.lock().unwrap() = Some(bar);
        } else {
            tell!("{phase}: {units} units to do");
        }
    }

    fn advance(&self, pulses: u64) {
        let mut state = self.state.lock().unwrap();
        state.2 += 1;
        let (phase, units, done, started) = *state;
        drop(state);
        if let Some(bar) = self.bar.lock().unwrap().as_ref() {
            bar.inc(1);
            bar.set_message(format!("{pulses} pulses"));
        } else {
            tell!(
                "{phase}: {done}/{units} done ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        }
    }

    fn end(&self) {
        if let Some(bar) = self.bar.lock().unwrap().take() {
            bar.finish();
        }
    }
}

fn run_convert(args: ConvertArgs) -> Result<()> {
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

fn run_inspect(dir: PathBuf, json: bool) -> Result<()> {
    let dataset = Arc::new(Dataset::open(&dir, ChecksumPolicy::Lazy)?);
    let report = inspect(&dataset)?;
    let m = dataset.manifest();
    // What a saved loader state names as its `dataset`.
    let identity = View::from(dataset.clone()).identity();
    if json {
        let value = serde_json::json!({"inspection": report, "parameters": m.parameters, "schema": m.schema, "identity": identity});
        say!("{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    say!("dataset      {}", dir.display())?;
    say!("events       {}", report.events)?;
    say!("DOMs         {}", report.doms)?;
    say!("pulses       {}", report.pulses)?;
    say!(
        "shards       {} ({:.2} MiB)",
        report.shards,
        report.bytes as f64 / (1 << 20) as f64
    )?;
    say!("seed         {}", m.parameters.seed)?;
    say!("sources      {} batch files", m.sources.batches.len())?;
    say!("identity     {identity}")?;
    say!("               min   median      mean      p99      max")?;
    for (name, d) in [
        ("pulses/event", report.pulses_per_event),
        ("DOMs/event", report.doms_per_event),
        ("pulses/DOM", report.pulses_per_dom),
    ] {
        say!(
            "{name:<12} {:>5} {:>8} {:>9.2} {:>8} {:>8}",
            d.min,
            d.median,
            d.mean,
            d.p99,
            d.max
        )?;
    }
    say!(
        "single-pulse DOMs {:.1}%",
        100.0 * report.single_pulse_dom_fraction
    )?;
    let b = &report.bytes_by_level;
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    say!(
        "bytes        {:.2} per event, {:.2} per DOM, {:.2} per pulse (levels); \
         {:.2} MiB of headers, {:.3} MiB sensor table",
        b.bytes_per_event,
        b.bytes_per_dom,
        b.bytes_per_pulse,
        mib(b.header_bytes),
        mib(b.sensor_table_bytes)
    )?;
    say!(
        "per pulse    {:.2} bytes in all; format v1 would store {:.2} ({:.2} MiB)",
        b.total_bytes_per_pulse,
        b.v1_bytes_per_pulse,
        mib(b.v1_bytes)
    )?;
    let t = &m.schema.types;
    say!(
        "types        sensor_id {:?}, position {:?}, time {:?}, charge {:?}, labels {}",
        t.sensor_id,
        t.position,
        t.time,
        t.charge,
        t.labels
    )?;
    say!("layout       {}", m.schema.layout.name())?;
    say!("DOM order    {}", m.schema.dom_order)?;
    say!("pulse order  {}", m.schema.pulse_order)?;
    for shard in &m.shards {
        say!(
            "  {}  {} events  {} pulses  {} bytes  xxh3 {}",
            shard.file,
            shard.events,
            shard.pulses,
            shard.bytes,
            shard.xxh3
        )?;
    }
    Ok(())
}

fn run_order(args: OrderArgs) -> Result<()> {
    let batching = match args.max_pulses {
        Some(max_pulses) => Batching::Pulses {
            max_pulses,
            max_events: args.sampler.max_events,
        },
        None => args.sampler.batching(),
    };
    let config = LoaderConfig {
        sampler: SamplerConfig {
            seed: args.sampler.seed,
            block_events: args.sampler.block_events,
            window_blocks: args.window,
            run_events: args.sampler.run_events,
            batching,
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

fn run_verify(dir: PathBuf, against: Option<PathBuf>, split: Option<String>) -> Result<()> {
    let source = against
        .map(|a| InputSet::discover(&a, split.as_deref()))
        .transpose()?;
    let report = verify(&dir, source.as_ref())?;
    for problem in &report.problems {
        tell!("problem: {problem}");
    }
    if report.problem_count > report.problems.len() as u64 {
        tell!(
            "... and {} more problems",
            report.problem_count - report.problems.len() as u64
        );
    }
    let compared = report
        .source_events
        .map_or(String::new(), |n| format!(", {n} source events compared"));
    if !report.ok() {
        bail!(
            "{}: {} problems ({} shards, {} events checked{compared})",
            dir.display(),
            report.problem_count,
            report.shards,
            report.events
        );
    }
    say!(
        "{}: OK ({} shards, {} events, {} pulses{compared})",
        dir.display(),
        report.shards,
        report.events,
        report.pulses
    )?;
    Ok(())
}

fn run_copy(
    dataset: PathBuf,
    destination: PathBuf,
    layout: Option<LayoutArg>,
    check: bool,
) -> Result<()> {
    let layout = layout.map(ShardLayout::from);
    let options = CopyOptions { layout, check };
    let report = copy_dataset_with(&dataset, &destination, &options, &Reporter::new())?;
    let how = match layout {
        Some(layout) => format!(" ({} layout)", layout.name()),
        None => String::new(),
    };
    let files = format!(
        "{} shards, the sensor table and the manifest, {:.1} MB",
        report.shards,
        report.bytes as f64 / 1e6
    );
    let (from, to) = (dataset.display(), destination.display());
    let rate = |bytes: u64| {
        format!(
            "{:.2} s ({:.0} MB/s)",
            report.seconds,
            bytes as f64 / 1e6 / report.seconds.max(1e-9)
        )
    };
    match report.outcome {
        CopyOutcome::Present => {
            let checked = if check {
                "; every file's checksum matches"
            } else {
                ""
            };
            say!("{to} holds this copy of {from}{how} already ({files}): nothing copied{checked}")?
        }
        CopyOutcome::Repaired => say!(
            "{from} -> {to}{how}: {files}, checked: {} files matched, {:.1} MB copied again in \
             {}; checksums match",
            report.kept,
            report.written as f64 / 1e6,
            rate(report.written)
        )?,
        CopyOutcome::Copied => say!(
            "{from} -> {to}{how}: {files} in {}; checksums match",
            rate(report.bytes)
        )?,
        CopyOutcome::Resumed => say!(
            "{from} -> {to}{how}: {files}, finishing a stopped copy: {} files kept (sizes \
             and checksums match), {:.1} MB written in {}; checksums match",
            report.kept,
            report.written as f64 / 1e6,
            rate(report.written)
        )?,
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(run_cli(std::env::args_os()))
}

/// The whole command line: parses `args` (the program name first), runs the command and
/// reports an error with its causes (quietly ends with [`console::CLOSED_STDOUT_STATUS`]
/// when stdout's reader has gone); returns the exit status. The Python package's
/// `shardify` console script calls this too, so both installs behave the same.
pub fn run_cli(args: impl IntoIterator<Item = std::ffi::OsString>) -> u8 {
    console::log_to_stderr();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0, mistakes to stderr with 2.
            let _ = e.print();
            return e.exit_code().try_into().unwrap_or(2);
        }
    };
    console::exit_status(run(cli.command))
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Convert(args) => run_convert(args),
        Command::Inspect { dataset, json } => run_inspect(dataset, json),
        Command::Dump { dataset, event } => {
            let dataset = Dataset::open(&dataset, ChecksumPolicy::Lazy)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let written = dump(&dataset, event, &mut out)?;
            out.flush()?;
            if let (Some(id), 0) = (event, written) {
                bail!("event {id} is not in the dataset");
            }
            Ok(())
        }
        Command::Verify {
            dataset,
            against,
            split,
        } => run_verify(dataset, against, split),
        Command::Order(args) => run_order(args),
        Command::Copy {
            dataset,
            destination,
            layout,
            check,
        } => run_copy(dataset, destination, layout, check),
    }
}
