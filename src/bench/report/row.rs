//! One row of a run: the shardify loader at one window size and variant, its measured
//! epochs each paired with the memcpy just before and after it, and the stages and bounds
//! measured on the same batches.

use std::sync::Arc;
use std::time::Instant;

use super::{figures, waiting_thread, BenchConfig, LoaderFigures, MemcpyBound};
use crate::batch::BatchLayout;
use crate::bench::baselines::Throughput;
use crate::bench::hand_off::{cache_line_round_trip_ns, CachePlacement};
use crate::bench::median;
use crate::bench::quality::{quality, EventInfo};
use crate::bench::stages::{
    copy_stage_gb_per_s, gather_stages, largest_batch_bytes, planning, scattered_copy, BareGather,
    BarePass, Consumer, GatherWay, GpuBounds,
};
use crate::cores::process_cpu_seconds;
use crate::dataset::Dataset;
use crate::device::staging::StagingPool;
use crate::device::Placement;
use crate::error::Result;
use crate::pipeline::{Loader, LoaderConfig, WorkerScheduling};
use crate::sampler::{BatchPlan, SamplerConfig, SamplerState};

/// What every row of a run shares: the dataset, the settings, where batches go and the
/// bounds measured once for the run.
pub(super) struct Rows<'a> {
    pub dataset: &'a Arc<Dataset>,
    pub config: &'a BenchConfig,
    pub placement: &'a Placement,
    /// The run's memcpy, measured again around every epoch.
    pub memcpy: &'a MemcpyBound,
    /// The run's memcpy bound, GB/s, measured before the rows.
    pub bound: f64,
    pub way: GatherWay,
    /// With `--cold`: the cold sequential read of the shards, GB/s.
    pub cold_read: Option<f64>,
    pub gpu: Option<&'a GpuBounds>,
}

/// A row's epochs: the warm-up epoch that grows the staging pool, then the measured ones,
/// with the memcpy before the first and after each, and the bare gather after each.
struct MeasuredEpochs {
    first: EpochRun,
    epochs: Vec<EpochRun>,
    /// memcpy GB/s before the first measured epoch and after each.
    between: Vec<f64>,
    /// The bare gather of the first measured epoch's batches, once after each epoch.
    bare_passes: Vec<BarePass>,
    /// A cache line's round trip between two threads before and after the epochs.
    round_trips: (Option<f64>, Option<f64>),
    /// Staging buffers the pool allocated during the measured epochs.
    allocations: Option<u64>,
}

impl MeasuredEpochs {
    /// The measured epochs' delivered events, pulses, bytes and seconds together.
    fn total(&self) -> Throughput {
        let epochs = &self.epochs;
        Throughput {
            events: epochs.iter().map(|e| e.throughput.events).sum(),
            pulses: epochs.iter().map(|e| e.throughput.pulses).sum(),
            bytes: epochs.iter().map(|e| e.throughput.bytes).sum(),
            seconds: epochs.iter().map(|e| e.throughput.seconds).sum(),
        }
    }

    /// The median memcpy between the epochs, GB/s: what the stages are divided by.
    fn memcpy_between(&self) -> f64 {
        median(&self.between)
    }

    /// Batches over the measured epochs.
    fn batches(&self) -> usize {
        self.epochs.iter().map(|e| e.batches).sum()
    }

    /// The delivered bytes against the memcpy around the epochs, epoch by epoch, and the
    /// cache placement the round trips show.
    fn set_memcpy_figures(&self, f: &mut LoaderFigures) {
        let between = &self.between;
        let memcpy_around = [between[0], between[between.len() - 1]];
        f.memcpy_around_gb_per_s = Some(memcpy_around);
        let (before, after) = self.round_trips;
        f.cache_line_round_trip_ns_before = before;
        f.cache_line_round_trip_ns_after = after;
        f.cache_placement = CachePlacement::from_round_trips(before, after);
        f.ratio_to_memcpy_around = Some(f.gb_per_s / (memcpy_around.iter().sum::<f64>() / 2.0));
        let epoch_gb: Vec<f64> = self
            .epochs
            .iter()
            .map(|e| e.throughput.gb_per_s())
            .collect();
        let paired: Vec<f64> = epoch_gb
            .iter()
            .zip(between.windows(2))
            .map(|(gb, around)| gb / ((around[0] + around[1]) / 2.0))
            .collect();
        f.median_paired_ratio_to_memcpy = Some(median(&paired));
        f.paired_ratios_to_memcpy = Some(paired);
        f.epoch_gb_per_s = Some(epoch_gb);
        f.memcpy_between_epochs_gb_per_s = Some(between.clone());
    }

    /// Where the loader's threads spent the epochs: gathering (the waiting thread's part
    /// apart), blocked, planning, and the consumer's waits; the pool's allocations and the
    /// warm-up epoch's pace.
    fn set_thread_figures(&self, f: &mut LoaderFigures, workers: usize) {
        let (epochs, total, batches) = (&self.epochs, self.total(), self.batches().max(1));
        let per_batch = |seconds: fn(&EpochRun) -> f64| {
            epochs.iter().map(seconds).sum::<f64>() / batches as f64
        };
        let wait: f64 = epochs.iter().map(|e| e.wait).sum();
        let gather: f64 = epochs.iter().map(|e| e.gather).sum();
        let gather_while_waiting: f64 = epochs.iter().map(|e| e.gather_while_waiting.0).sum();
        let batches_while_waiting: usize = epochs.iter().map(|e| e.gather_while_waiting.1).sum();
        let gather_gb = total.bytes as f64 / 1e9 / (gather / workers as f64).max(1e-12);
        f.gather_seconds = Some(gather);
        f.waiting_thread_gather_seconds = Some(gather_while_waiting);
        f.gathered_while_waiting_fraction = Some(batches_while_waiting as f64 / batches as f64);
        f.gather_gb_per_s = Some(gather_gb);
        f.gather_ratio_to_memcpy = Some(gather_gb / self.memcpy_between());
        let worker_gather = gather - gather_while_waiting;
        f.outside_gather_seconds_per_batch =
            Some((workers as f64 * total.seconds - worker_gather).max(0.0) / batches as f64);
        f.buffer_wait_seconds_per_batch = Some(per_batch(|e| e.buffer_wait));
        f.permit_wait_seconds_per_batch = Some(per_batch(|e| e.permit_wait));
        f.planning_in_loader_seconds_per_batch = Some(per_batch(|e| e.planning));
        f.measured_epoch_allocations = self.allocations;
        let first = &self.first.throughput;
        f.first_epoch_events_per_s = Some(first.events as f64 / first.seconds.max(1e-9));
        f.wait_seconds = Some(wait);
        f.compute_seconds = Some(epochs.iter().map(|e| e.compute).sum());
        f.waiting_fraction = Some(wait / total.seconds.max(1e-9));
        f.cpus_busy = epochs
            .iter()
            .map(|e| e.cpu_seconds)
            .sum::<Option<f64>>()
            .map(|cpu| cpu / total.seconds.max(1e-9));
    }

    /// The bare gather's passes against the epochs they followed.
    fn set_bare_gather_figures(&self, f: &mut LoaderFigures) {
        let Some(first) = self.bare_passes.first() else {
            return;
        };
        let passes: Vec<f64> = self.bare_passes.iter().map(|p| p.seconds).collect();
        let seconds = median(&passes);
        f.bare_gather_seconds = Some(seconds);
        f.bare_gather_pass_seconds = Some(passes);
        f.bare_gather_bound_ratio_to_memcpy =
            Some(first.bytes as f64 / seconds.max(1e-12) / 1e9 / self.memcpy_between());
        // Each pass over the epoch just before it, the median: paired as the memcpy ratios
        // are, where the mean epoch against the median pass moved with outliers.
        let paired: Vec<f64> = self
            .bare_passes
            .iter()
            .zip(&self.epochs)
            .map(|(pass, epoch)| pass.seconds / epoch.throughput.seconds.max(1e-12))
            .collect();
        f.ratio_to_bare_gather = Some(median(&paired));
    }
}

impl Rows<'_> {
    /// The row named `name`: the loader at `window` in `variant`, every figure measured.
    pub(super) fn measure(
        &self,
        name: &str,
        window: usize,
        variant: Variant,
    ) -> Result<LoaderFigures> {
        let measured = self.measured_epochs(window, variant)?;
        let (dataset, config) = (self.dataset, self.config);
        let epochs = &measured.epochs;
        let q = quality(
            &shardify_infos(dataset, &epochs[0].plans)?,
            &shardify_infos(dataset, &epochs[1].plans)?,
        );
        let total = measured.total();
        let mut f = figures(name, Some(window), total, self.bound, q);
        measured.set_memcpy_figures(&mut f);
        measured.set_thread_figures(&mut f, config.workers);
        let scattered = scattered_copy(dataset, &epochs[0].plans, config.workers, self.way)?;
        let epoch_seconds = total.seconds / epochs.len() as f64;
        let epoch_bytes = total.bytes as f64 / epochs.len() as f64;
        f.scattered_copy_gb_per_s = Some(scattered.gb_per_s());
        f.scattered_copy_seconds = Some(scattered.seconds);
        f.scattered_copy_bound_ratio_to_memcpy =
            Some(epoch_bytes / scattered.seconds.max(1e-12) / 1e9 / measured.memcpy_between());
        f.ratio_to_scattered_copy = Some(scattered.seconds / epoch_seconds.max(1e-12));
        measured.set_bare_gather_figures(&mut f);
        f.gather_stages = Some(gather_stages(
            dataset,
            &epochs[0].plans,
            config.dom_positions,
            loader_config(config, window, variant).staging_buffers(self.placement),
            self.way,
        )?);
        f.planning = Some(planning(dataset, &sampler(config, window), 0)?);
        if let Some(disk) = self.cold_read {
            let bytes = dataset.manifest().totals.bytes as f64;
            f.cold_events_per_s = Some(f.events_per_s);
            f.cold_ratio_to_disk = Some(bytes / epoch_seconds.max(1e-9) / 1e9 / disk);
        }
        if let (Some(bounds), Some(device)) = (self.gpu, self.placement.cuda()) {
            let timed = epochs
                .iter()
                .filter_map(|e| e.copy)
                .reduce(|(s, b), (s2, b2)| (s + s2, b + b2));
            let (idle, busy) = epochs
                .iter()
                .filter_map(|e| e.gpu_idle_busy_ms)
                .fold((0.0, 0.0), |(i, b), (i2, b2)| (i + i2, b + b2));
            if let Some((seconds, bytes)) = timed {
                f.timed_copy_seconds = Some(seconds);
                f.timed_copy_gb_per_s = Some(bytes as f64 / seconds.max(1e-12) / 1e9);
            }
            let (stage_gb, _) = copy_stage_gb_per_s(device, &epochs[0].batch_bytes)?;
            f.copy_stage_gb_per_s = Some(stage_gb);
            f.copy_stage_seconds = Some(total.bytes as f64 / 1e9 / stage_gb.max(1e-12));
            f.copy_stage_ratio_to_pinned_h2d = Some(stage_gb / bounds.pinned_h2d_gb_per_s);
            f.ratio_to_pinned_h2d = Some(f.gb_per_s / bounds.pinned_h2d_gb_per_s);
            f.gpu_waiting_fraction = Some(idle / (idle + busy).max(1e-12));
        }
        Ok(f)
    }

    /// The row's epochs. One staging pool serves them, as a job keeps one: a first epoch
    /// grows it (reported apart), then it is grown to the measured epochs' largest batch (a
    /// long job's pool has seen its largest batches; a pool that grows again inside a
    /// measured epoch reallocates every buffer there, measured at 28 ms on top of a 38 ms
    /// epoch), and the measured epochs run on it.
    fn measured_epochs(&self, window: usize, variant: Variant) -> Result<MeasuredEpochs> {
        let (dataset, config) = (self.dataset, self.config);
        let mut pool = None;
        let epoch = |e, keep_plans, pool: &mut Option<Arc<StagingPool>>| {
            if config.cold {
                dataset.evict_from_page_cache()?;
            }
            run_epoch(
                dataset,
                config,
                self.placement,
                (window, variant),
                (e, keep_plans),
                pool,
            )
        };
        let measured: Vec<u64> = (0..config.epochs as u64).collect();
        let first = epoch(config.epochs as u64, false, &mut pool)?;
        let largest = largest_batch_bytes(
            dataset,
            &sampler(config, window),
            config.dom_positions,
            &measured,
        )?;
        let allocations_before = pool.as_ref().map(|p| {
            p.reserve(largest);
            p.allocations()
        });
        // memcpy before the first measured epoch and after each: every epoch is paired
        // with the bound measured just before and just after it.
        let round_trip_before = cache_line_round_trip_ns();
        let mut between = vec![self.memcpy.measure_settled()?];
        let mut epochs = Vec::with_capacity(measured.len());
        let mut bare = BareGather::new(dataset, config.workers, config.dom_positions, self.way);
        let mut bare_passes = Vec::with_capacity(measured.len());
        for &e in &measured {
            // Only the first two epochs' plans are read again (quality, stages).
            epochs.push(epoch(e, e < 2, &mut pool)?);
            between.push(self.memcpy.measure()?);
            // The bare gather of the first measured epoch's batches, in the loader's pool
            // (its loader gone, every buffer free), so each pass shares its epoch's moment
            // as the memcpy does.
            if let Some(pool) = &pool {
                bare_passes.push(bare.pass(&epochs[0].plans, pool)?);
            }
        }
        drop(bare);
        let round_trip_after = cache_line_round_trip_ns();
        let allocations = pool
            .as_ref()
            .zip(allocations_before)
            .map(|(p, before)| p.allocations() - before);
        // The pool's buffers go back here: the stages measured after the epochs allocate
        // their own (the rotated gather as many as the pool holds), and the run never holds
        // both.
        drop(pool);
        Ok(MeasuredEpochs {
            first,
            epochs,
            between,
            bare_passes,
            round_trips: (round_trip_before, round_trip_after),
            allocations,
        })
    }
}

/// The sampler of a row at `window`: the run's settings and batching.
pub(super) fn sampler(config: &BenchConfig, window: usize) -> SamplerConfig {
    SamplerConfig {
        seed: config.seed,
        block_events: config.block_events,
        window_blocks: window,
        run_events: config.run_events,
        batching: config.batching,
        batch_order: config.batch_order,
        group_by_length: config.group_by_length,
        ..SamplerConfig::default()
    }
}

/// What one epoch of a row's loader measured.
struct EpochRun {
    /// The epoch's batch plans, when kept (only the first two measured epochs' are read
    /// again); `batches` counts them either way.
    plans: Vec<BatchPlan>,
    batches: usize,
    throughput: Throughput,
    gather: f64,
    /// The part of `gather` the waiting thread spent, and the batches it gathered.
    gather_while_waiting: (f64, usize),
    /// The workers' seconds blocked for a staging buffer, summed over the epoch's batches.
    buffer_wait: f64,
    /// The workers' seconds waiting for a gathering permit, summed over the epoch's batches.
    permit_wait: f64,
    /// The loader's threads' seconds planning, summed over the epoch's batches.
    planning: f64,
    /// The process's CPU seconds during the epoch (`None` where the system does not say).
    cpu_seconds: Option<f64>,
    wait: f64,
    compute: f64,
    copy: Option<(f64, u64)>,
    batch_bytes: Vec<usize>,
    gpu_idle_busy_ms: Option<(f64, f64)>,
}

/// How one row's loader runs, besides its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Variant {
    scheduling: WorkerScheduling,
    consumer_gathers: bool,
}

impl Variant {
    /// Every combination of the configured settings, the loader's defaults first when
    /// they are configured first.
    pub(super) fn all(config: &BenchConfig) -> Vec<Variant> {
        config
            .worker_scheduling
            .iter()
            .flat_map(|&scheduling| {
                config
                    .consumer_gathers
                    .iter()
                    .map(move |&consumer_gathers| Variant {
                        scheduling,
                        consumer_gathers,
                    })
            })
            .collect()
    }

    /// The row's name: "shardify", followed by the settings in which it differs from the
    /// first variant.
    pub(super) fn name(self, first: Variant) -> String {
        let mut differences = Vec::new();
        if self.scheduling != first.scheduling {
            differences.push(format!("{} scheduling", self.scheduling.name()));
        }
        if self.consumer_gathers != first.consumer_gathers {
            differences.push(waiting_thread(self.consumer_gathers).to_string());
        }
        match differences.is_empty() {
            true => "shardify".to_string(),
            false => format!("shardify ({})", differences.join(", ")),
        }
    }
}

/// The loader's configuration for `window` and `variant`.
fn loader_config(config: &BenchConfig, window: usize, variant: Variant) -> LoaderConfig {
    LoaderConfig {
        sampler: sampler(config, window),
        layout: BatchLayout::Packed,
        workers: config.workers,
        prefetch: config.prefetch,
        device: config.device,
        time_copies: config.time_copies,
        device_buffers: config.device_buffers,
        dom_positions: config.dom_positions,
        worker_scheduling: variant.scheduling,
        consumer_gathers: variant.consumer_gathers,
        prefetch_level: config.prefetch_level,
        columns_passes: config.columns_passes,
    }
}

/// One epoch at `window` with the loader in `variant`, gathered into `pool`'s buffers when
/// there is one (left holding the loader's pool, for the next epoch); its batch plans
/// recorded when `keep_plans`.
fn run_epoch(
    dataset: &Arc<Dataset>,
    config: &BenchConfig,
    placement: &Placement,
    (window, variant): (usize, Variant),
    (epoch, keep_plans): (u64, bool),
    pool: &mut Option<Arc<StagingPool>>,
) -> Result<EpochRun> {
    let loader_config = loader_config(config, window, variant);
    let mut consumer = Consumer::new(placement, config.simulate_compute_ms)?;
    let mut loader = Loader::on_pool(
        dataset.clone(),
        loader_config,
        SamplerState::start(epoch),
        placement.clone(),
        pool.take(),
    )?;
    *pool = Some(loader.staging_pool().clone());
    let mut run = EpochRun {
        plans: Vec::new(),
        batches: 0,
        throughput: Throughput::default(),
        gather: 0.0,
        gather_while_waiting: (0.0, 0),
        buffer_wait: 0.0,
        permit_wait: 0.0,
        planning: 0.0,
        cpu_seconds: None,
        wait: 0.0,
        compute: 0.0,
        copy: None,
        batch_bytes: Vec::new(),
        gpu_idle_busy_ms: None,
    };
    let started = Instant::now();
    let cpu_started = process_cpu_seconds();
    loop {
        let asked = Instant::now();
        let Some(batch) = loader.next() else { break };
        run.wait += asked.elapsed().as_secs_f64();
        let mut batch = batch?;
        run.throughput.events += batch.plan().events.len() as u64;
        run.throughput.pulses += batch.shape().pulses as u64;
        run.throughput.bytes += batch.sections().payload_bytes() as u64;
        run.gather += batch.gather_seconds();
        if batch.gathered_while_waiting() {
            run.gather_while_waiting.0 += batch.gather_seconds();
            run.gather_while_waiting.1 += 1;
        }
        run.buffer_wait += batch.buffer_wait_seconds();
        run.permit_wait += batch.permit_wait_seconds();
        run.planning += batch.planning_seconds();
        run.compute += consumer.consume(&mut batch)?;
        if let Some(copy) = batch.device() {
            run.batch_bytes.push(batch.bytes().len());
            if let Some(ms) = copy.copy_ms()? {
                let (seconds, bytes) = run.copy.get_or_insert((0.0, 0));
                *seconds += f64::from(ms) / 1e3;
                *bytes += batch.bytes().len() as u64;
            }
        }
        run.batches += 1;
        if keep_plans {
            run.plans.push(batch.plan().clone());
        }
    }
    run.gpu_idle_busy_ms = consumer.finish()?;
    run.throughput.seconds = started.elapsed().as_secs_f64();
    run.cpu_seconds = process_cpu_seconds()
        .zip(cpu_started)
        .map(|(now, then)| now - then);
    Ok(run)
}

/// What the shuffle-quality report needs of each event of `plans`.
fn shardify_infos(dataset: &Dataset, plans: &[BatchPlan]) -> Result<Vec<Vec<EventInfo>>> {
    let mut first_index = vec![0u64];
    for s in &dataset.manifest().shards {
        first_index.push(first_index.last().unwrap() + s.events);
    }
    let views = (0..dataset.shard_count())
        .map(|i| dataset.shard(i)?.stored())
        .collect::<Result<Vec<_>>>()?;
    Ok(plans
        .iter()
        .map(|p| {
            p.events
                .iter()
                .map(|e| {
                    let h = views[e.shard as usize]
                        .event_tensors()
                        .header(e.index as usize);
                    EventInfo {
                        event_id: h.event_id,
                        source_file: h.batch_id,
                        zenith: h.zenith,
                        stored_position: first_index[e.shard as usize] + e.index as u64,
                        pulses: views[e.shard as usize]
                            .pulse_range(e.index as usize..e.index as usize + 1)
                            .len() as u64,
                    }
                })
                .collect()
        })
        .collect())
}
