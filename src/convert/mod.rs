//! The converter: Kaggle Parquet in, pre-shuffled DOM-packed shards out, in bounded memory.
//!
//! Four phases, each made of independent, idempotent units whose results are files in the
//! work directory (`OUT/.work`), so a killed run restarts where it stopped and a cluster can
//! run the units of one phase as a job array:
//! 1. **plan**: read footers and geometry, choose the bucket count (`plan.json`);
//! 2. **scatter** (one unit per batch file): validate and spill each event to its bucket;
//! 3. **gather** (one unit per bucket): sort the bucket by shuffle key, pack, write a shard;
//! 4. **finalize**: write `manifest.json` (last), remove the work directory.
//!
//! Same inputs, seed and parameters give byte-identical shards and manifest, whatever the
//! thread count or task split.

mod allocator;
pub mod bucket_chunks;
pub mod bucket_shard;
pub mod chunk_table;
mod memory_bank;
pub mod meta_split;
mod options;
pub mod plan;
pub mod relayout;
pub mod scatter;
pub mod shard_writer;
pub mod spill;
pub mod work;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::atomic::{sync_dir, sync_file};
use crate::format::manifest::{Parameters, Schema, Sources, Totals, FORMAT, FORMAT_VERSION};
use crate::format::{Manifest, SensorTable};
use crate::source::{Geometry, InputSet};
use allocator::{map_large_allocations, release_free_memory};
use bucket_chunks::SpillFiles;
use bucket_shard::{bucket_memory, storage_types, BucketRecord, GatherScratch};
use memory_bank::{for_each_unit, MemoryBank};
use options::MIN_SPILL_BUFFER;
pub use options::{
    ConvertOptions, FIXED_OVERHEAD, MIN_MEMORY_LIMIT, SCATTER_DECODE_MEMORY, THREAD_MEMORY,
};
use plan::Plan;
use spill::SpillIndex;
use work::WorkDir;

/// Which phase(s) to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Every phase, on this machine.
    All,
    /// Only the plan.
    Plan,
    /// Scatter units (of this task's slice).
    Scatter,
    /// Gather units (of this task's slice).
    Gather,
    /// The manifest.
    Finalize,
}

impl Phase {
    /// Whether the phase writes into the output directory alone (a whole conversion, its
    /// plan, its finalize), not beside other tasks of a job array (scatter, gather).
    pub fn writes_alone(self) -> bool {
        !matches!(self, Phase::Scatter | Phase::Gather)
    }
}

/// The units one task of a job array takes: those whose number is `index` modulo `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSlice {
    /// This task, `0..count`.
    pub index: u64,
    /// Tasks in the array.
    pub count: u64,
}

impl Default for TaskSlice {
    fn default() -> Self {
        TaskSlice { index: 0, count: 1 }
    }
}

impl TaskSlice {
    fn takes(&self, unit: u64) -> bool {
        unit % self.count == self.index
    }
}

/// Receives progress; implemented by the binary (progress bars or log lines).
pub trait Progress: Sync {
    /// A phase starts with `units` units to do.
    fn begin(&self, phase: &'static str, units: u64);
    /// A unit finished, having handled `pulses` pulses.
    fn advance(&self, pulses: u64);
    /// The phase ended.
    fn end(&self);
}

/// Progress that goes nowhere.
pub struct Silent;

impl Progress for Silent {
    fn begin(&self, _: &'static str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn end(&self) {}
}

/// What a call to [`convert`] did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The manifest, when the dataset is complete.
    pub manifest: Option<Manifest>,
    /// Whether the dataset was already complete before this call.
    pub already_complete: bool,
    /// Units run by this call, per phase.
    pub units_run: Vec<(&'static str, u64)>,
    /// Units skipped because an earlier run finished them.
    pub units_skipped: u64,
    /// Input pulses this call scattered.
    pub pulses_scattered: u64,
    /// Seconds per phase run.
    pub seconds: Vec<(&'static str, f64)>,
    /// Bytes of spill files the conversion wrote (known once finalized).
    pub spill_bytes: Option<u64>,
    /// The units of the scatter and gather phases (what a job array covers), and whether
    /// the meta is split by batch in the plan phase.
    pub planned: Option<PlannedUnits>,
}

/// What the plan decided that a job array must cover.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlannedUnits {
    /// Scatter units: one per batch file.
    pub scatter: u64,
    /// Gather units: one per bucket.
    pub gather: u64,
    /// Whether the plan phase splits the meta by batch.
    pub meta_split: bool,
}

/// Converts the inputs of `split` found under `input` (see [`InputSet::discover`]) into
/// `out` in this process: every phase and every task, without progress output. What a
/// benchmark or a test wants; the `shardify convert` command runs [`convert`] itself.
pub fn convert_in_one_go(
    input: &Path,
    split: Option<&str>,
    out: &Path,
    options: &ConvertOptions,
) -> Result<Summary> {
    let inputs = InputSet::discover(input, split)?;
    convert(
        &inputs,
        out,
        options,
        Phase::All,
        TaskSlice::default(),
        &Silent,
    )
}

/// The most threads a conversion runs on per core it may use. Past some hundreds a core,
/// rayon's idle threads spend the run looking for work in each other's queues and every
/// phase waits for all of them: on 2 cores, the 300 events of the fixtures converted in
/// 0.01-0.05 s on 2 to 256 threads, 0.94 s on 1,024 and 104 s on 4,064, and 320k events in
/// 2.3-2.8 s on 2 to 256 threads but 8.6-8.9 s on 1,024. Up to here more threads than
/// cores cost nothing (and can overlap the writes).
const MOST_THREADS_PER_CORE: usize = 64;

/// Runs `phase` of the conversion of `inputs` into `out` (see the module docs).
pub fn convert(
    inputs: &InputSet,
    out: &Path,
    options: &ConvertOptions,
    phase: Phase,
    slice: TaskSlice,
    progress: &dyn Progress,
) -> Result<Summary> {
    options.validate()?;
    if slice.count == 0 || slice.index >= slice.count {
        return Err(Error::config(
            "task_index",
            format!(
                "task index {} is not below task count {}",
                slice.index, slice.count
            ),
        ));
    }
    if slice.count > 1 && !matches!(phase, Phase::Scatter | Phase::Gather) {
        return Err(Error::config(
            "task_count",
            "a task index/count applies to the scatter and gather phases only",
        ));
    }
    map_large_allocations();
    let within_memory = options.threads_within_limit();
    let cores = crate::cores::available_cores();
    let most = cores.saturating_mul(MOST_THREADS_PER_CORE);
    let threads = within_memory.min(most);
    if threads < options.threads {
        let why = if most < within_memory {
            format!(
                "more than {MOST_THREADS_PER_CORE} a core (this process may run on {cores}) \
                 would spend the run looking for work in each other's queues"
            )
        } else {
            format!(
                "each holds about {} KiB of its own (its stack, its allocator arena), and \
                 under --memory-limit {} MiB more would leave too little for the data",
                THREAD_MEMORY >> 10,
                options.memory_limit_bytes >> 20
            )
        };
        tracing::warn!(
            "running on {threads} of the {} threads asked for: {why}",
            options.threads
        );
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::config("threads", format!("cannot start {threads} threads: {e}")))?;
    pool.install(|| run_phases(inputs, out, options, phase, slice, progress))
}

fn run_phases(
    inputs: &InputSet,
    out: &Path,
    options: &ConvertOptions,
    phase: Phase,
    slice: TaskSlice,
    progress: &dyn Progress,
) -> Result<Summary> {
    let work = WorkDir::new(out);
    let mut summary = Summary::default();
    let started = Instant::now();
    let (plan, geometry) = Plan::build(inputs, options)?;
    summary
        .seconds
        .push(("plan", started.elapsed().as_secs_f64()));
    summary.planned = Some(PlannedUnits {
        scatter: inputs.batches.len() as u64,
        gather: plan.parameters.bucket_count,
        meta_split: plan.meta_split,
    });
    if work.is_finished() {
        return already_complete(&plan, &work, summary);
    }
    if matches!(phase, Phase::All | Phase::Plan) {
        plan.check_free_space(out)?;
    }
    work.prepare()?;
    // Held until this run returns: no other run writes here meanwhile, unless both are
    // tasks of a job array.
    let _lock = work.lock(phase.writes_alone())?;
    if work.is_finished() {
        // Finished by another run between the check above and the lock.
        return already_complete(&plan, &work, summary);
    }
    plan.store_or_check(&work)?;
    let run = Run {
        inputs,
        options,
        slice,
        progress,
        plan: &plan,
        geometry: &geometry,
        work: &work,
    };
    if plan.meta_split {
        if matches!(phase, Phase::All | Phase::Plan) {
            timed(&mut summary, "split meta", |_| run.split_meta())?;
        } else if phase == Phase::Scatter && !work.meta_split_dir().exists() {
            tracing::warn!(
                "the meta is not split by batch yet (run `--phase plan` once before the \
                 scatter tasks): each scatter unit reads the whole meta"
            );
        }
    }
    if matches!(phase, Phase::All | Phase::Scatter) {
        timed(&mut summary, "scatter", |summary| run.scatter(summary))?;
    }
    if matches!(phase, Phase::All | Phase::Gather) {
        timed(&mut summary, "gather", |summary| run.gather(summary))?;
    }
    if matches!(phase, Phase::All | Phase::Finalize) {
        timed(&mut summary, "finalize", |summary| {
            let (manifest, spill_bytes) = finalize(&plan, &geometry, &work)?;
            summary.manifest = Some(manifest);
            summary.spill_bytes = Some(spill_bytes);
            summary.units_run.push(("finalize", 1));
            Ok(())
        })?;
    }
    Ok(summary)
}

/// Runs `phase` and records its seconds in `summary`.
fn timed(
    summary: &mut Summary,
    phase: &'static str,
    run: impl FnOnce(&mut Summary) -> Result<()>,
) -> Result<()> {
    let started = Instant::now();
    run(summary)?;
    summary
        .seconds
        .push((phase, started.elapsed().as_secs_f64()));
    Ok(())
}

/// What every phase of one call works from.
struct Run<'a> {
    inputs: &'a InputSet,
    options: &'a ConvertOptions,
    slice: TaskSlice,
    progress: &'a dyn Progress,
    plan: &'a Plan,
    geometry: &'a Geometry,
    work: &'a WorkDir,
}

impl Run<'_> {
    /// Splits the shared meta by batch (see [`meta_split`]), with the units' memory
    /// (half of it buffered: the allocations may double).
    fn split_meta(&self) -> Result<()> {
        let budget = self
            .options
            .unit_memory()
            .saturating_sub(SCATTER_DECODE_MEMORY)
            / 2;
        meta_split::build(
            self.work,
            self.inputs,
            self.plan.labels,
            budget.max(MIN_SPILL_BUFFER) as usize,
            self.progress,
        )
    }

    /// Pass 1: this task's batch files, each scattered to the buckets' spill chunks.
    fn scatter(&self, summary: &mut Summary) -> Result<()> {
        let (plan, work, options) = (self.plan, self.work, self.options);
        let mine = (self.inputs.batches.iter().enumerate())
            .filter(|(i, _)| self.slice.takes(*i as u64))
            .map(|(_, b)| b);
        let todo = units_to_run(
            mine,
            |b| scatter::is_done_and_intact(work, b.batch_id),
            summary,
        )?;
        self.progress.begin("scatter", todo.len() as u64);
        let buffer = options.scatter_buffer(plan.parameters.bucket_count) as usize;
        let unit_memory = options.scatter_unit_memory(plan.parameters.bucket_count);
        let bank: MemoryBank = MemoryBank::new(options.unit_memory());
        let pulses = AtomicU64::new(0);
        for_each_unit(&todo, |batch| {
            let _lease = bank.acquire(unit_memory);
            let index =
                scatter::scatter_batch(plan, self.inputs, batch, self.geometry, work, buffer)?;
            // Before the lease goes back: the next unit may run on another thread,
            // whose allocator arena would grow while this one's kept the freed memory.
            release_free_memory();
            self.progress.advance(index.pulses);
            pulses.fetch_add(index.pulses, Ordering::Relaxed);
            Ok(())
        })?;
        self.progress.end();
        release_free_memory();
        summary.pulses_scattered = pulses.into_inner();
        summary.units_run.push(("scatter", todo.len() as u64));
        Ok(())
    }

    /// Pass 2: this task's buckets, each gathered into its shard.
    fn gather(&self, summary: &mut Summary) -> Result<()> {
        let (plan, work) = (self.plan, self.work);
        let spills = SpillFiles::open(work, load_spill_indexes(plan, work)?)?;
        if !spills.all_held() {
            tracing::warn!(
                "the open-files limit (ulimit -n) is too low to hold every spill file open: \
                 the rest are opened for each bucket, which is slower on a cluster filesystem"
            );
        }
        let types = storage_types(plan, spills.indexes());
        let mine = (0..plan.parameters.bucket_count).filter(|b| self.slice.takes(*b));
        let todo = units_to_run(
            mine,
            |&b| bucket_shard::is_done_and_intact(work, b),
            summary,
        )?;
        self.progress.begin("gather", todo.len() as u64);
        // Each unit's scratch buffers are parked in the bank when it ends, their memory
        // still counted, for the next unit to take over (see `MemoryBank`). Kept outside
        // the bank, an idle scratch held as much memory as a running unit, counted by no
        // lease. A unit reads its bucket's chunks from the chunk tables before its lease:
        // a few entries a spill file, not counted.
        let bank: MemoryBank<GatherScratch> = MemoryBank::new(self.options.unit_memory());
        for_each_unit(&todo, |&bucket| {
            let chunks = spills.chunks_of(bucket)?;
            let mut lease = bank.acquire(bucket_memory(&chunks));
            let record =
                bucket_shard::gather_bucket(plan, bucket, &chunks, &spills, types, lease.scratch());
            release_free_memory();
            drop(lease);
            self.progress
                .advance(record?.shard.as_ref().map_or(0, |s| s.pulses));
            Ok(())
        })?;
        self.progress.end();
        summary.units_run.push(("gather", todo.len() as u64));
        Ok(())
    }
}

/// The units among `units` that an earlier run has not finished; counts the others as
/// skipped in `summary`.
fn units_to_run<T>(
    units: impl Iterator<Item = T>,
    done: impl Fn(&T) -> Result<bool>,
    summary: &mut Summary,
) -> Result<Vec<T>> {
    let mut todo = Vec::new();
    for unit in units {
        if done(&unit)? {
            summary.units_skipped += 1;
        } else {
            todo.push(unit);
        }
    }
    Ok(todo)
}

fn load_spill_indexes(plan: &Plan, work: &WorkDir) -> Result<Vec<SpillIndex>> {
    plan.sources
        .batches
        .iter()
        .map(|b| {
            let batch_id = b.batch_id.expect("batch sources carry their id");
            if !scatter::is_done(work, batch_id)? {
                return Err(Error::config(
                    "phase",
                    format!(
                        "the scatter phase has not finished {} (batch {batch_id}): run it first",
                        b.path
                    ),
                ));
            }
            work.read_json(&work.spill_index(batch_id))
        })
        .collect()
}

/// The summary of a run that finds the dataset `plan` describes already finished in
/// `work`'s output directory (a finished dataset from other inputs or parameters is an
/// error), after removing the work files of a run killed between its manifest and its
/// clean-up.
fn already_complete(plan: &Plan, work: &WorkDir, mut summary: Summary) -> Result<Summary> {
    let out = work.out();
    let manifest = Manifest::read(out)?;
    let made = |parameters: &Parameters, sources: &Sources| serde_json::json!({"parameters": parameters, "sources": sources.by_content()});
    let there = made(&manifest.parameters, &manifest.sources);
    if let Some(difference) = plan::difference(&there, &made(&plan.parameters, &plan.sources)) {
        return Err(Error::Layout {
            path: out.to_path_buf(),
            problem: format!(
                "holds a finished dataset made from other inputs or parameters ({difference}); \
                 refusing to overwrite it: convert into another directory, or remove this one"
            ),
        });
    }
    work.clean_up()?;
    summary.already_complete = true;
    summary.manifest = Some(manifest);
    Ok(summary)
}

/// Writes the sensor table and the manifest; returns the manifest and the bytes of spill
/// files the conversion wrote.
fn finalize(plan: &Plan, geometry: &Geometry, work: &WorkDir) -> Result<(Manifest, u64)> {
    let indexes = load_spill_indexes(plan, work)?;
    let mut shards = Vec::new();
    for bucket in 0..plan.parameters.bucket_count {
        if !bucket_shard::is_done(work, bucket)? {
            return Err(Error::config(
                "phase",
                format!("the gather phase has not finished bucket {bucket}: run it first"),
            ));
        }
        let record: BucketRecord = work.read_json(&work.bucket_record(bucket))?;
        shards.extend(record.shard);
    }
    let totals = Totals {
        events: shards.iter().map(|s| s.events).sum(),
        doms: shards.iter().map(|s| s.doms).sum(),
        pulses: shards.iter().map(|s| s.pulses).sum(),
        bytes: shards.iter().map(|s| s.bytes).sum(),
    };
    let scattered: u64 = indexes.iter().map(|i| i.events).sum();
    if totals.events != scattered {
        return Err(Error::manifest(
            work.root(),
            format!(
                "shards hold {} events but the scatter phase read {scattered}",
                totals.events
            ),
        ));
    }
    // Shards were written without fsync (see `bucket_shard::is_done_and_intact`); make them durable before
    // the manifest declares the dataset complete.
    shards
        .par_iter()
        .map(|s| sync_file(&work.out().join(&s.file)))
        .collect::<Result<Vec<()>>>()?;
    let types = storage_types(plan, &indexes);
    let sensor_table = SensorTable::new(&geometry.positions(), types.position).write(work.out())?;
    sync_dir(work.out())?;
    let manifest = Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        parameters: plan.parameters.clone(),
        schema: Schema {
            layout: plan.parameters.layout,
            ..Schema::current(types)
        },
        totals,
        shards,
        sensor_table,
        sources: plan.sources.clone(),
    };
    manifest.write(work.out())?;
    work.clean_up()?;
    Ok((manifest, indexes.iter().map(|i| i.spill_bytes).sum()))
}
