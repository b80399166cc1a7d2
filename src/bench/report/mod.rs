//! One benchmark run: the shardify loader at several window sizes and the Parquet
//! baselines, each with throughput, its ratio to memcpy measured in the same run, time per
//! stage and shuffle quality; as a table for people and as JSON for tools.

mod row;
mod text;

pub use text::table;

use row::{Rows, Variant};

use std::sync::Arc;

use serde::Serialize;

use super::baselines::{SourceIndex, Throughput};
use super::hand_off::CachePlacement;
use super::machine::Machine;
use super::quality::{quality, Quality};
use super::stages::{
    cold_read_gb_per_s, shard_read_gb_per_s, GatherStages, GatherWay, GpuBounds, Planning,
};
use super::{median_of, memcpy_gb_per_s};
use crate::batch::ColumnsPasses;
use crate::dataset::huge_pages::shard_mapped_bytes;
use crate::dataset::Dataset;
use crate::device::{DeviceChoice, Placement};
use crate::error::Result;
use crate::pipeline::{batches_ahead, WorkerScheduling};
use crate::prefetch::PrefetchLevel;
use crate::sampler::{BatchOrder, Batching, LengthGrouping};
use crate::source::InputSet;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Window sizes (blocks) to run the shardify loader at.
    pub windows: Vec<usize>,
    /// Events per batch (all loaders, but the shardify rows' with `batching` a budget).
    pub batch_events: usize,
    /// The shardify rows' batching: `Events(batch_events)`, or a budget of pulses
    /// (`Batching::Pulses`) or of tokens (`Batching::Tokens`, with `group_by_length`).
    pub batching: Batching,
    /// Events per block.
    pub block_events: usize,
    /// Consecutive events drawn together.
    pub run_events: usize,
    /// The order of events inside a shardify batch.
    pub batch_order: BatchOrder,
    /// Whether shardify batches hold events of similar length
    /// (`SamplerConfig::group_by_length`).
    pub group_by_length: LengthGrouping,
    /// Gather threads.
    pub workers: usize,
    /// Batches the loader prepares ahead of the consumer (`LoaderConfig::prefetch`; `None`:
    /// the loader's default for the workers, [`crate::pipeline::batches_ahead`]).
    pub prefetch: Option<usize>,
    /// Scheduling policies of the gather threads, each measured at every window (rows
    /// after the first policy's are named with theirs: the same run compares them).
    pub worker_scheduling: Vec<WorkerScheduling>,
    /// Whether the thread waiting for a batch gathers one itself
    /// (`LoaderConfig::consumer_gathers`), each setting measured at every window and
    /// scheduling policy (rows after the first setting's are named with theirs).
    pub consumer_gathers: Vec<bool>,
    /// Seed of every loader's order.
    pub seed: u64,
    /// A simulated training step per batch, in milliseconds (0: none).
    pub simulate_compute_ms: f64,
    /// Decoded files the naive loader keeps.
    pub naive_cache_files: usize,
    /// Seconds each baseline may run (they can take hours on a large dataset).
    pub baseline_seconds: f64,
    /// Where the shardify loader delivers batches.
    pub device: DeviceChoice,
    /// On a GPU, time every copy in the run with timing events (a diagnostic that costs
    /// copy throughput; see `LoaderConfig::time_copies`).
    pub time_copies: bool,
    /// On a GPU, device buffers the loader keeps busy (`LoaderConfig::device_buffers`).
    pub device_buffers: usize,
    /// Whether batches carry `dom_position` (`LoaderConfig::dom_positions`).
    pub dom_positions: bool,
    /// Evict every shard from the page cache before each measured shardify epoch, and
    /// measure a cold sequential read of the shards as the bound.
    pub cold: bool,
    /// Measured shardify epochs per window and setting (at least 2: shuffle quality
    /// compares the first two), each between two memcpy measurements
    /// (`LoaderFigures::paired_ratios_to_memcpy`).
    pub epochs: usize,
    /// The caches the loader's prefetches fill (`LoaderConfig::prefetch_level`; `None`:
    /// the environment's `SHARDIFY_PREFETCH_LEVEL`, else this machine's level). The
    /// scattered-copy bound and the read floor prefetch alike.
    pub prefetch_level: Option<PrefetchLevel>,
    /// The passes the loader copies a columns shard in (`LoaderConfig::columns_passes`;
    /// `None`: the environment's `SHARDIFY_COLUMNS_PASSES`, else this machine's choice).
    /// The bounds copy alike.
    pub columns_passes: Option<ColumnsPasses>,
}

/// Figures of one loader.
#[derive(Debug, Clone, Serialize)]
pub struct LoaderFigures {
    /// Loader name.
    pub name: String,
    /// Window size in blocks (shardify only).
    pub window: Option<usize>,
    /// Events per second.
    pub events_per_s: f64,
    /// Pulses per second.
    pub pulses_per_s: f64,
    /// Delivered batch payload, GB/s.
    pub gb_per_s: f64,
    /// `gb_per_s` / memcpy GB/s of the same run.
    pub ratio_to_memcpy: f64,
    /// memcpy GB/s measured as the run-wide bound is, just before this row's measured
    /// epochs and just after them (shardify only): the machine's memory bandwidth drifts
    /// (on the shared 2-core machine by up to 16 GB/s within one run), and these two
    /// bracket the loader in time.
    pub memcpy_around_gb_per_s: Option<[f64; 2]>,
    /// `gb_per_s` / the mean of `memcpy_around_gb_per_s`.
    pub ratio_to_memcpy_around: Option<f64>,
    /// The time, in ns, two threads take to pass a cache line back and forth, just before
    /// this row's measured epochs (shardify only; `None` also where it could not be timed:
    /// [`super::hand_off`]). Long where the cores share no cache, and then every staging
    /// buffer line written on one core and next on the other crosses the memory fabric.
    pub cache_line_round_trip_ns_before: Option<f64>,
    /// The same just after them.
    pub cache_line_round_trip_ns_after: Option<f64>,
    /// Whether the two round trips put the row's threads on CPUs sharing a last-level
    /// cache, on CPUs without one, or moved during the row ([`CachePlacement`]; `None`
    /// where either was not timed): compare ratios to memcpy only within one placement.
    pub cache_placement: Option<CachePlacement>,
    /// Each measured epoch's delivered GB/s, in the order they ran (shardify only).
    pub epoch_gb_per_s: Option<Vec<f64>>,
    /// memcpy GB/s measured before the first measured epoch and after each one (shardify
    /// only): one more value than epochs.
    pub memcpy_between_epochs_gb_per_s: Option<Vec<f64>>,
    /// `epoch_gb_per_s`, each over the mean of the memcpy measured just before and just
    /// after its epoch (`memcpy_between_epochs_gb_per_s`): on a machine whose
    /// bandwidth drifts between seconds, the epoch and its bound share their moment.
    pub paired_ratios_to_memcpy: Option<Vec<f64>>,
    /// The median of `paired_ratios_to_memcpy` (of an even count, the mean of the middle
    /// two): the row's delivered share of memcpy, least moved by the machine's drift.
    pub median_paired_ratio_to_memcpy: Option<f64>,
    /// Events timed.
    pub events: u64,
    /// Seconds timed.
    pub seconds: f64,
    /// Seconds spent gathering, by the workers and by the thread waiting for batches
    /// (shard reads through the memory map included).
    pub gather_seconds: Option<f64>,
    /// The part of `gather_seconds` spent by the thread waiting for batches
    /// (`LoaderConfig::consumer_gathers`).
    pub waiting_thread_gather_seconds: Option<f64>,
    /// The share of the measured batches that thread gathered.
    pub gathered_while_waiting_fraction: Option<f64>,
    /// The gather stage's rate: bytes delivered / (`gather_seconds` / workers), GB/s.
    pub gather_gb_per_s: Option<f64>,
    /// `gather_gb_per_s` / memcpy GB/s with the same threads, same run: the median of the
    /// memcpy measured between the epochs (`memcpy_between_epochs_gb_per_s`), whose time the
    /// gathers share.
    pub gather_ratio_to_memcpy: Option<f64>,
    /// Copying the same events' shard bytes piece by piece, in each batch's storage order,
    /// with the same threads, same run, GB/s of stored bytes ([`super::stages::scattered_copy`]).
    pub scattered_copy_gb_per_s: Option<f64>,
    /// Seconds that copy takes for one epoch's batches: no gather of them takes less.
    pub scattered_copy_seconds: Option<f64>,
    /// The bound in delivered terms: one epoch's delivered bytes at the scattered copy's
    /// pace (`scattered_copy_seconds`), against the median of the memcpy measured between
    /// the epochs (`memcpy_between_epochs_gb_per_s`, the figures the paired ratios divide
    /// by). No loader that copies these pieces delivers more of memcpy than this (it also
    /// writes what the copy leaves out).
    pub scattered_copy_bound_ratio_to_memcpy: Option<f64>,
    /// The loader's pace against that bound: `scattered_copy_seconds` / the loader's
    /// seconds per epoch (1 would be a loader as fast as the bare copy).
    pub ratio_to_scattered_copy: Option<f64>,
    /// Seconds the loader's gather alone takes for the first measured epoch's batches,
    /// same run: its workers' count of threads gathering alternate batches into the
    /// loader's staging buffers, with no planning, hand-offs or waiting thread
    /// ([`BareGather`](super::stages::BareGather)); one pass after each measured epoch, the median. What the pipeline
    /// adds is the loader's time over this.
    pub bare_gather_seconds: Option<f64>,
    /// Each pass's seconds, in the order they ran: one after each measured epoch.
    pub bare_gather_pass_seconds: Option<Vec<f64>>,
    /// That bound in delivered terms: one epoch's delivered bytes at the bare gather's pace
    /// over the median of the memcpy measured between the epochs. Where it is under a
    /// target, no pipeline around this gather reaches the target in this run.
    pub bare_gather_bound_ratio_to_memcpy: Option<f64>,
    /// The loader's pace against the bare gather's: each pass's seconds over those of the
    /// epoch just before it, the median (1 would be a pipeline that costs nothing).
    pub ratio_to_bare_gather: Option<f64>,
    /// One thread's time per epoch on each part of the gather, the same batches, same run
    /// ([`gather_stages`](super::stages::gather_stages)): what remains to be made faster.
    pub gather_stages: Option<GatherStages>,
    /// Worker time per batch outside the gather: the workers' seconds per epoch (threads
    /// x epoch seconds) less the seconds they spent gathering (the waiting thread's gathers
    /// left out), over the epoch's batches.
    /// Planning, hand-offs, and time without a core, blocked for a staging buffer or waiting
    /// for a gathering permit.
    pub outside_gather_seconds_per_batch: Option<f64>,
    /// The part of it the workers spent blocked for a free staging buffer, per batch
    /// ([`Batch::buffer_wait_seconds`](crate::pipeline::Batch::buffer_wait_seconds)): the
    /// batches ahead were all gathered, or waited behind one still being gathered.
    pub buffer_wait_seconds_per_batch: Option<f64>,
    /// The part the workers then waited for a gathering permit, per batch
    /// ([`Batch::permit_wait_seconds`](crate::pipeline::Batch::permit_wait_seconds)): the
    /// waiting thread was gathering in a worker's place.
    pub permit_wait_seconds_per_batch: Option<f64>,
    /// One thread planning the first measured epoch's batches as the workers plan them
    /// ([`planning`](super::stages::planning)): the sampler's share of their time outside the gather.
    pub planning: Option<Planning>,
    /// Seconds a batch the loader's own threads spent planning, over the measured epochs
    /// ([`Batch::planning_seconds`](crate::pipeline::Batch::planning_seconds)): beside
    /// `planning`'s one thread alone, what the sampler costs inside the loader (twice as
    /// much where the threads' cores share no L3, on the 2-core Zen 4).
    pub planning_in_loader_seconds_per_batch: Option<f64>,
    /// Staging buffers allocated during the measured epochs: 0 when the pool, grown to
    /// their largest batch beforehand, held every batch (as a long job's does).
    pub measured_epoch_allocations: Option<u64>,
    /// Events per second of the first epoch, with the staging pool still growing (the
    /// measured epochs follow it on the same pool, as a long job's do).
    pub first_epoch_events_per_s: Option<f64>,
    /// Seconds the consumer waited for data.
    pub wait_seconds: Option<f64>,
    /// Seconds of simulated compute.
    pub compute_seconds: Option<f64>,
    /// `wait_seconds` / wall time.
    pub waiting_fraction: Option<f64>,
    /// The process's CPU time (all its threads) over the measured epochs' wall time: the
    /// CPUs the loader kept busy. Below the machine's count, cores stood idle (threads
    /// blocked or waking); at it, the gather's own cost is what remains.
    pub cpus_busy: Option<f64>,
    /// On a GPU: the loader's copy stage on its own, GB/s: this loader's batch sizes
    /// copied back to back from pinned staging through the loader's device slots.
    pub copy_stage_gb_per_s: Option<f64>,
    /// On a GPU: seconds the copy stage needs for the bytes this loader delivered, at
    /// `copy_stage_gb_per_s` (the host-to-device stage's time).
    pub copy_stage_seconds: Option<f64>,
    /// On a GPU: `copy_stage_gb_per_s` / the pinned host-to-device bound of the same run.
    pub copy_stage_ratio_to_pinned_h2d: Option<f64>,
    /// With `time_copies`: seconds the copy stream spent on the run's copies, timed per
    /// copy (on an idle stream this includes the host's latency issuing each copy).
    pub timed_copy_seconds: Option<f64>,
    /// With `time_copies`: bytes copied / `timed_copy_seconds`, GB/s.
    pub timed_copy_gb_per_s: Option<f64>,
    /// On a GPU: `gb_per_s` / the pinned host-to-device bound of the same run.
    pub ratio_to_pinned_h2d: Option<f64>,
    /// On a GPU: the fraction of the consumer's GPU time spent idle between steps,
    /// waiting for data (event-timed on one step in 8: timing events are too dear to
    /// record around every short step).
    pub gpu_waiting_fraction: Option<f64>,
    /// With `--cold`: events/s over the epochs started with the shards out of the page
    /// cache.
    pub cold_events_per_s: Option<f64>,
    /// With `--cold`: (the dataset's shard bytes / a cold epoch's seconds) /
    /// `cold_read_gb_per_s`: how close a cold epoch comes to reading the shards once at the
    /// disk's sequential rate.
    pub cold_ratio_to_disk: Option<f64>,
    /// Shuffle quality (epochs 0 and 1).
    pub quality: Quality,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Machine facts.
    pub machine: Machine,
    /// Events in the dataset.
    pub dataset_events: u64,
    /// Pulses in the dataset.
    pub dataset_pulses: u64,
    /// memcpy GB/s with the loader's thread count, same run.
    pub memcpy_gb_per_s: f64,
    /// The same memcpy measured again after the shardify loaders ran: how far the machine
    /// drifted during the run (every ratio divides by `memcpy_gb_per_s`).
    pub memcpy_after_loaders_gb_per_s: f64,
    /// Bytes per copy in that measurement (an average batch).
    pub memcpy_chunk_bytes: usize,
    /// One sequential pass over the shards through the memory map, GB/s (the read stage
    /// on its own).
    pub shard_read_gb_per_s: f64,
    /// Seconds of that pass.
    pub shard_read_seconds: f64,
    /// After that pass, the share of the shards' bytes the process maps in huge pages
    /// (how the page cache holds them: shards written by `shardify convert` and still
    /// cached are, where the kernel caches files in large folios; see
    /// [`crate::format::chunked`]); `None` where the kernel does not say.
    pub shard_huge_page_fraction: Option<f64>,
    /// With `--cold`: one cold sequential read of every shard file, GB/s (the disk's bound
    /// on a cold epoch).
    pub cold_read_gb_per_s: Option<f64>,
    /// Host-to-device bounds, when batches went to a GPU.
    pub gpu: Option<GpuBounds>,
    /// Device buffers the loader kept busy, when batches went to a GPU.
    pub device_buffers: Option<usize>,
    /// Best shardify window: events/s.
    pub events_per_s: f64,
    /// Best shardify window: pulses/s.
    pub pulses_per_s: f64,
    /// Best shardify window: GB/s.
    pub gb_per_s: f64,
    /// Best shardify window: ratio to memcpy.
    pub ratio_to_memcpy: f64,
    /// Best shardify window's events/s over the naive loader's.
    pub speedup_vs_naive: Option<f64>,
    /// Best shardify window's events/s over the Parquet block-shuffle loader's.
    pub speedup_vs_block_shuffle: Option<f64>,
    /// Simulated compute per batch, ms.
    pub simulate_compute_ms: f64,
    /// Events per batch (the baselines', and shardify's unless `batching` says otherwise).
    pub batch_events: usize,
    /// The shardify rows' budget when they are not batches of `batch_events`, as the
    /// loader's arguments name it (`max_tokens 65536`).
    #[serde(default)]
    pub batching: Option<String>,
    /// Events per block (shardify).
    pub block_events: usize,
    /// Consecutive events drawn together (shardify).
    pub run_events: usize,
    /// The order of events inside a shardify batch.
    pub batch_order: BatchOrder,
    /// Whether shardify batches held events of similar length.
    pub group_by_length: LengthGrouping,
    /// Gather threads (shardify).
    pub workers: usize,
    /// Batches the loader prepared ahead of the consumer (shardify).
    pub prefetch: usize,
    /// The caches its prefetches filled (shardify), and the bounds' prefetches.
    pub prefetch_level: PrefetchLevel,
    /// The passes its gather copied columns shards in (shardify), and the bounds'.
    pub columns_passes: ColumnsPasses,
    /// Their scheduling policies, in the order the rows were measured.
    pub worker_scheduling: Vec<WorkerScheduling>,
    /// Whether the waiting thread gathered, in the order the rows were measured.
    pub consumer_gathers: Vec<bool>,
    /// Every loader.
    pub loaders: Vec<LoaderFigures>,
}

/// Name of the naive baseline in reports.
pub const NAIVE: &str = "naive random access (LRU of decoded files)";
/// Name of the block-shuffle baseline in reports.
pub const BLOCK_SHUFFLE: &str = "parquet block shuffle (file-aware)";

/// What the thread waiting for a batch does, in a report's words.
fn waiting_thread(gathers: bool) -> &'static str {
    match gathers {
        true => "waiting thread gathers",
        false => "waiting thread sleeps",
    }
}

/// The run's memcpy bound: copies of the first 256 MiB of the shards, in pieces of an
/// average batch's bytes (at least 4 KiB), with the loader's threads. The sample is taken
/// once and measured as often as the run needs (before and after every measured epoch).
struct MemcpyBound {
    sample: Vec<u8>,
    chunk: usize,
    threads: usize,
}

impl MemcpyBound {
    /// The sample of `dataset`'s shards, copied in `batch_bytes` pieces by `threads`.
    fn new(dataset: &Dataset, batch_bytes: usize, threads: usize) -> Result<MemcpyBound> {
        let mut sample = Vec::new();
        for i in 0..dataset.shard_count() {
            let bytes = dataset.shard(i)?.bytes();
            sample.extend_from_slice(
                &bytes[..bytes.len().min((256 << 20) - sample.len().min(256 << 20))],
            );
        }
        Ok(MemcpyBound {
            sample,
            chunk: batch_bytes.max(4096),
            threads,
        })
    }

    /// GB/s now: the median of 5 passes (one pass lasts ~20 ms, and single passes on a
    /// shared 2-core machine ranged 13-20 GB/s within minutes).
    fn measure(&self) -> Result<f64> {
        median_of(5, || {
            Ok(memcpy_gb_per_s(&self.sample, self.chunk, self.threads))
        })
    }

    /// [`MemcpyBound::measure`] after other work than the loader's epochs (the shards'
    /// checksums, the sample's allocation, a row's warm-up epoch and stage measurements),
    /// after one measurement untimed: the first after such work ran low, where the
    /// measurements between the epochs did not (2-core Zen 5, docs/results.md, "The memcpy
    /// before a row, settled").
    fn measure_settled(&self) -> Result<f64> {
        self.measure()?;
        self.measure()
    }
}

fn figures(
    name: &str,
    window: Option<usize>,
    t: Throughput,
    memcpy: f64,
    quality: Quality,
) -> LoaderFigures {
    let secs = t.seconds.max(1e-9);
    let gb = t.gb_per_s();
    LoaderFigures {
        name: name.into(),
        window,
        events_per_s: t.events as f64 / secs,
        pulses_per_s: t.pulses as f64 / secs,
        gb_per_s: gb,
        ratio_to_memcpy: gb / memcpy,
        memcpy_around_gb_per_s: None,
        ratio_to_memcpy_around: None,
        cache_line_round_trip_ns_before: None,
        cache_line_round_trip_ns_after: None,
        cache_placement: None,
        epoch_gb_per_s: None,
        memcpy_between_epochs_gb_per_s: None,
        paired_ratios_to_memcpy: None,
        median_paired_ratio_to_memcpy: None,
        events: t.events,
        seconds: t.seconds,
        gather_seconds: None,
        waiting_thread_gather_seconds: None,
        gathered_while_waiting_fraction: None,
        gather_gb_per_s: None,
        gather_ratio_to_memcpy: None,
        scattered_copy_gb_per_s: None,
        scattered_copy_seconds: None,
        scattered_copy_bound_ratio_to_memcpy: None,
        ratio_to_scattered_copy: None,
        bare_gather_seconds: None,
        bare_gather_pass_seconds: None,
        bare_gather_bound_ratio_to_memcpy: None,
        ratio_to_bare_gather: None,
        gather_stages: None,
        outside_gather_seconds_per_batch: None,
        buffer_wait_seconds_per_batch: None,
        permit_wait_seconds_per_batch: None,
        planning: None,
        planning_in_loader_seconds_per_batch: None,
        measured_epoch_allocations: None,
        first_epoch_events_per_s: None,
        wait_seconds: None,
        compute_seconds: None,
        waiting_fraction: None,
        cpus_busy: None,
        copy_stage_gb_per_s: None,
        copy_stage_seconds: None,
        copy_stage_ratio_to_pinned_h2d: None,
        timed_copy_seconds: None,
        timed_copy_gb_per_s: None,
        ratio_to_pinned_h2d: None,
        gpu_waiting_fraction: None,
        cold_events_per_s: None,
        cold_ratio_to_disk: None,
        quality,
    }
}

/// The events of a mean shardify batch: `batch_events`, or under a budget the
/// dataset's events over the batches of an epoch at the first window (one pass over its
/// order, reading the events' lengths).
fn mean_batch_events(dataset: &Arc<Dataset>, config: &BenchConfig) -> Result<usize> {
    if let Batching::Events(n) = config.batching {
        return Ok(n);
    }
    let sampler = row::sampler(config, config.windows.first().copied().unwrap_or(1));
    let view = crate::dataset::View::from(dataset.clone());
    let batches = crate::pipeline::rank_batch_count(&view, &sampler, 0, 0)?;
    Ok((dataset.manifest().totals.events / batches.max(1)).max(1) as usize)
}

/// Runs every loader: the Parquet baselines when `source` is given, then shardify at each
/// window size.
pub fn run(
    dataset: Arc<Dataset>,
    source: Option<&InputSet>,
    config: &BenchConfig,
) -> Result<Report> {
    // Resolved once: every loader and every bound of the run prefetch and copy alike.
    let prefetch_level = PrefetchLevel::resolve(config.prefetch_level)?;
    let columns_passes = ColumnsPasses::resolve(config.columns_passes)?;
    let way = GatherWay {
        level: prefetch_level,
        passes: columns_passes,
    };
    let config = &BenchConfig {
        prefetch_level: Some(prefetch_level),
        columns_passes: Some(columns_passes),
        ..config.clone()
    };
    let m = dataset.manifest();
    // One bound for the whole run: copies of an average batch's size, with the loader's
    // threads (`MemcpyBound`). Measured again around every measured epoch, and after the
    // shardify loaders, to show how far the machine drifted while they ran.
    let batch_bytes =
        (m.totals.bytes / m.totals.events.max(1)) as usize * mean_batch_events(&dataset, config)?;
    let memcpy = MemcpyBound::new(&dataset, batch_bytes, config.workers)?;
    let bound = memcpy.measure_settled()?;
    let (shard_read_gb_per_s, shard_read_seconds) = shard_read_gb_per_s(&dataset)?;
    let shard_huge_page_fraction =
        shard_mapped_bytes(&dataset).and_then(|mapped| mapped.huge_fraction());
    let cold_read = match config.cold {
        true => Some(cold_read_gb_per_s(&dataset)?.0),
        false => None,
    };
    let placement = Placement::resolve(config.device)?;
    let gpu = match placement.cuda() {
        Some(device) => Some(GpuBounds::measure(device, batch_bytes)?),
        None => None,
    };
    let rows = Rows {
        dataset: &dataset,
        config,
        placement: &placement,
        memcpy: &memcpy,
        bound,
        way,
        cold_read,
        gpu: gpu.as_ref(),
    };
    let mut loaders = Vec::new();
    let variants = Variant::all(config);
    for &variant in &variants {
        let name = variant.name(variants[0]);
        for &window in &config.windows {
            loaders.push(rows.measure(&name, window, variant)?);
        }
    }
    let memcpy_after = memcpy.measure_settled()?;
    if let Some(source) = source {
        loaders.extend(baselines(source, config, bound)?);
    }
    let best = loaders
        .iter()
        .filter(|l| l.window.is_some())
        .max_by(|a, b| a.events_per_s.total_cmp(&b.events_per_s))
        .cloned();
    let best_rate = best.as_ref().map_or(0.0, |b| b.events_per_s);
    let speedup = |name: &str| {
        loaders
            .iter()
            .find(|l| l.name.starts_with(name))
            .map(|l| best_rate / l.events_per_s.max(1e-9))
    };
    let (speedup_vs_naive, speedup_vs_block_shuffle) = (speedup(NAIVE), speedup(BLOCK_SHUFFLE));
    Ok(Report {
        machine: Machine::probe(placement.describe()),
        dataset_events: m.totals.events,
        dataset_pulses: m.totals.pulses,
        memcpy_gb_per_s: bound,
        memcpy_after_loaders_gb_per_s: memcpy_after,
        memcpy_chunk_bytes: batch_bytes.max(4096),
        shard_read_gb_per_s,
        shard_read_seconds,
        shard_huge_page_fraction,
        cold_read_gb_per_s: cold_read,
        device_buffers: gpu.as_ref().map(|_| config.device_buffers.max(2)),
        gpu,
        events_per_s: best.as_ref().map_or(0.0, |b| b.events_per_s),
        pulses_per_s: best.as_ref().map_or(0.0, |b| b.pulses_per_s),
        gb_per_s: best.as_ref().map_or(0.0, |b| b.gb_per_s),
        ratio_to_memcpy: best.as_ref().map_or(0.0, |b| b.ratio_to_memcpy),
        speedup_vs_naive,
        speedup_vs_block_shuffle,
        simulate_compute_ms: config.simulate_compute_ms,
        batch_events: config.batch_events,
        batching: (!matches!(config.batching, Batching::Events(_)))
            .then(|| config.batching.to_string()),
        block_events: config.block_events,
        run_events: config.run_events,
        batch_order: config.batch_order,
        group_by_length: config.group_by_length,
        workers: config.workers,
        prefetch: batches_ahead(config.prefetch, config.workers),
        prefetch_level,
        columns_passes,
        worker_scheduling: config.worker_scheduling.clone(),
        consumer_gathers: config.consumer_gathers.clone(),
        loaders,
    })
}

/// The Parquet baselines over `source`, naive random access then the file-aware block
/// shuffle, each with its shuffle quality, against the run's memcpy `bound`.
fn baselines(source: &InputSet, config: &BenchConfig, bound: f64) -> Result<Vec<LoaderFigures>> {
    let index = SourceIndex::new(source)?;
    let b = config.batch_events;
    let naive = [
        index.naive_order(config.seed, 0, b),
        index.naive_order(config.seed, 1, b),
    ];
    let q = quality(&index.infos(&naive[0]), &index.infos(&naive[1]));
    let t = index.run_naive(&naive[0], config.naive_cache_files, config.baseline_seconds)?;
    let naive_figures = figures(NAIVE, None, t, bound, q);
    let blocks = [
        index.block_shuffle_order(config.seed, 0, b),
        index.block_shuffle_order(config.seed, 1, b),
    ];
    let q = quality(&index.infos(&blocks[0]), &index.infos(&blocks[1]));
    let t = index.run_block_shuffle(&blocks[0], config.baseline_seconds)?;
    Ok(vec![
        naive_figures,
        figures(BLOCK_SHUFFLE, None, t, bound, q),
    ])
}
