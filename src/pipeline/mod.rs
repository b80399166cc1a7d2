//! The loader: threads and channels from the sampler to delivered batches.
//!
//! ```text
//! worker threads --filled buffers--> consumer (in order)
//! (each takes a free staging    (at most the pool's buffers:
//!  buffer, then the sampler's    batches ahead)
//!  next plan, gathers into it)
//!
//! on a GPU: ... --filled buffers--> uploader thread --copies--> consumer
//!                                   (in order; copy stream -> device slots)
//! ```
//! The workers share the sampler: whichever finds few plans ready plans the next 16 under
//! its lock (planning a batch costs a small fraction of gathering it), so no planner thread
//! is woken per batch and the sampler's state moves between cores once per 16 batches
//! (`plans`). A worker takes a free staging
//! buffer *before* it takes the next plan, so the oldest batch in flight always owns a
//! buffer and reordering can never starve it. The thread that waits for the next batch in
//! order (the consumer, or the uploader on a GPU) gathers one itself while it would wait,
//! with the workers' plans lent to it ([`LoaderConfig::consumer_gathers`], `helping`). On a GPU the
//! staging buffers are pinned, and an uploader thread queues each batch's copy onto the
//! device's copy stream ([`crate::device::transfer`]) as soon as a device buffer is free:
//! with two, the copy of batch n+1 runs while the consumer's GPU work on batch n does, and
//! the consumer's thread makes no copy calls. Dropping a [`Batch`] returns its buffers;
//! dropping the [`Loader`] stops and joins every thread. Errors (a corrupt or missing
//! shard, a failed driver call) come out of the iterator.

mod batches_ahead;
mod delivered;
mod helping;
mod in_order;
mod permits;
mod plans;
mod scheduling;
mod staging_budget;
mod uploader;
mod workers;

use std::sync::Arc;
use std::thread::JoinHandle;

use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, TryRecvError};
use serde::{Deserialize, Serialize};

pub use batches_ahead::{batches_ahead, default_prefetch};
pub use delivered::{Batch, DeviceSection};
pub use in_order::Arrival;
pub use scheduling::{WorkerScheduling, GATHER_THREAD_NAME, UPLOAD_THREAD_NAME};
pub use staging_budget::check_staging_fits;

use crate::batch::{BatchLayout, ColumnsPasses};
use crate::dataset::{DatasetSizes, View};
use crate::device::staging::{plain_allocator, Allocator, StagingPool};
use crate::device::transfer::{DeviceCopy, DeviceSlots};
use crate::device::{DeviceChoice, Placement};
use crate::error::{Error, Result};
use crate::prefetch::PrefetchLevel;
use crate::sampler::{self, Batching, LengthGrouping, SamplerConfig, SamplerState};
use helping::Lending;
use in_order::InOrder;
use permits::GatherPermits;
use staging_budget::check_staging_fits_with;
use uploader::{upload_batches, Uploaded};
use workers::{run_workers, Filled, Stop};

/// How a loader runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderConfig {
    /// Order, batching and partition.
    pub sampler: SamplerConfig,
    /// Batch layout.
    pub layout: BatchLayout,
    /// Gathering threads.
    pub workers: usize,
    /// Batches prepared ahead of the consumer, each in a staging buffer of its own; `None`
    /// (the default) takes [`default_prefetch`]: twice the workers that can run at once
    /// (at most the cores), at least 4 ([`LoaderConfig::batches_ahead`]).
    #[serde(default)]
    pub prefetch: Option<usize>,
    /// Where batches are delivered (`auto` by default: CUDA device 0 if usable).
    #[serde(default)]
    pub device: DeviceChoice,
    /// Device buffers kept busy on a GPU (at least 2: one being consumed, one being
    /// filled). More only help when the consumer's work per batch varies a lot.
    #[serde(default = "default_device_buffers")]
    pub device_buffers: usize,
    /// Time every host-to-device copy with CUDA timing events (`Batch::device()`'s
    /// `copy_ms`, `copy_started`), for diagnostics. Off by default: on an H100, two timing
    /// events per copy cut 436 KB copies from 40 to 32 GB/s, while plain events cost
    /// nothing measurable (`examples/h2d_overheads.rs`).
    #[serde(default)]
    pub time_copies: bool,
    /// Whether packed batches carry `dom_position` (each DOM's row of the sensor table,
    /// looked up while gathering). `false` leaves it out, for models that embed sensor ids
    /// or look positions up on the GPU from
    /// [`Dataset::sensor_table`](crate::dataset::Dataset::sensor_table); the padded layout
    /// always has positions among its features, so it requires `true`.
    #[serde(default = "default_dom_positions")]
    pub dom_positions: bool,
    /// How the gathering threads are scheduled beside the consumer: `Batch` (Linux
    /// `SCHED_BATCH`, the default) keeps a worker that wakes from preempting the consumer's
    /// thread, which on a machine with no core to spare costs the consumer a context switch
    /// per batch ([`WorkerScheduling`]).
    #[serde(default)]
    pub worker_scheduling: WorkerScheduling,
    /// Whether the thread waiting for the next batch gathers one itself while it waits
    /// (the consumer's on the CPU, the uploader's on a GPU), instead of sleeping until a
    /// worker sends it (`true` by default). With as many workers as cores, a sleeping
    /// consumer is woken onto a core a worker needs; gathering while it would wait anyway
    /// made the 2-core machine deliver 15-30% more events/s (docs/results.md, "The waiting
    /// thread gathers"). A batch it is gathering when the next one arrives delays that one
    /// by at most one gather.
    #[serde(default = "default_consumer_gathers")]
    pub consumer_gathers: bool,
    /// The caches the gathering threads' prefetches fill. `None` (the default) takes the
    /// environment's [`PREFETCH_LEVEL_VAR`](crate::prefetch::PREFETCH_LEVEL_VAR) when set, else the level that gathers fastest
    /// on this CPU ([`PrefetchLevel::for_this_machine`]: L2 on AMD's family 25, which
    /// delivered 22-28% more events a second there at windows 4-64, L1 elsewhere).
    #[serde(default)]
    pub prefetch_level: Option<PrefetchLevel>,
    /// How the gathering threads copy a columns shard's runs, in one pass or two (the
    /// batches are the same bytes either way). `None` (the default) takes the environment's
    /// [`COLUMNS_PASSES_VAR`](crate::batch::COLUMNS_PASSES_VAR) when set, else the choice
    /// that gathers fastest on this CPU ([`ColumnsPasses::for_this_machine`]: two on AMD's
    /// family 25, one elsewhere).
    #[serde(default)]
    pub columns_passes: Option<ColumnsPasses>,
}

fn default_consumer_gathers() -> bool {
    true
}

fn default_dom_positions() -> bool {
    true
}

impl LoaderConfig {
    /// Batches prepared ahead of the consumer: `prefetch`, or when it is `None`,
    /// [`default_prefetch`] of the workers on the cores this process may use.
    pub fn batches_ahead(&self) -> usize {
        batches_ahead(self.prefetch, self.workers)
    }

    /// The staging buffers a loader of this configuration starts with on `placement`: one
    /// per worker and per batch prefetched, two for the consumer, and on a GPU one per
    /// device buffer and one for the batch the uploader holds while it waits for a slot.
    pub fn staging_buffers(&self, placement: &Placement) -> usize {
        self.staging_buffers_with(self.batches_ahead(), placement)
    }

    /// [`LoaderConfig::staging_buffers`] with `ahead` batches ahead, already resolved.
    fn staging_buffers_with(&self, ahead: usize, placement: &Placement) -> usize {
        let device = match placement.cuda() {
            Some(_) => self.device_buffers.saturating_add(1),
            None => 0,
        };
        self.workers
            .saturating_add(ahead)
            .saturating_add(device)
            .saturating_add(2)
    }

    /// The caches the gathering threads' prefetches fill: `prefetch_level`, else
    /// [`PREFETCH_LEVEL_VAR`](crate::prefetch::PREFETCH_LEVEL_VAR), else this machine's level ([`PrefetchLevel::resolve`]).
    pub fn resolved_prefetch_level(&self) -> Result<PrefetchLevel> {
        PrefetchLevel::resolve(self.prefetch_level)
    }

    /// How the gathering threads copy a columns shard's runs: `columns_passes`, else
    /// [`COLUMNS_PASSES_VAR`](crate::batch::COLUMNS_PASSES_VAR), else this machine's choice
    /// ([`ColumnsPasses::resolve`]).
    pub fn resolved_columns_passes(&self) -> Result<ColumnsPasses> {
        ColumnsPasses::resolve(self.columns_passes)
    }

    /// Rejects settings that cannot work (a bad [`PREFETCH_LEVEL_VAR`] or
    /// [`COLUMNS_PASSES_VAR`] among them, when the configuration leaves the choice to it).
    ///
    /// [`PREFETCH_LEVEL_VAR`]: crate::prefetch::PREFETCH_LEVEL_VAR
    /// [`COLUMNS_PASSES_VAR`]: crate::batch::COLUMNS_PASSES_VAR
    pub fn validate(&self) -> Result<()> {
        self.sampler.validate()?;
        self.resolved_prefetch_level()?;
        self.resolved_columns_passes()?;
        if self.workers == 0 {
            return Err(Error::config("workers", "must be at least 1"));
        }
        if self.prefetch == Some(0) {
            return Err(Error::config("prefetch", "must be at least 1"));
        }
        if self.device_buffers < 2 {
            return Err(Error::config(
                "device_buffers",
                format!(
                    "must be at least 2 (one being consumed, one being filled), not {}",
                    self.device_buffers
                ),
            ));
        }
        if let BatchLayout::Padded { max_doms: 0, .. } = self.layout {
            return Err(Error::config(
                "layout",
                "a padded batch needs max_doms of at least 1 (DOMs kept per event)",
            ));
        }
        self.check_budget_of_padded_rows()?;
        if !self.dom_positions && self.layout != BatchLayout::Packed {
            return Err(Error::config(
                "dom_positions",
                "false applies to the packed layout only (the padded layout's features \
                 hold x, y, z)",
            ));
        }
        Ok(())
    }

    /// Refuses a token budget of DOM rows over the padded layout unless it counts an
    /// event's DOMs as the grid keeps them, capped at `max_doms`: uncapped or capped above,
    /// an event of more DOMs would count rows it never fills (at `max_doms` 64, one of 300
    /// DOMs counted 300), and batches of long events would hold a fraction of `max_tokens`;
    /// capped below, it would count fewer rows than it fills, and grids would overrun the
    /// budget (a cap of 16 under `max_doms` 64 gave grids of 1,024 rows for a budget of 256).
    /// Refuses a budget under `max_doms` too: an event of more DOMs than the budget forms a
    /// batch alone, a grid of up to `max_doms` rows over it (`max_tokens` 32 under
    /// `max_doms` 64 overran it in 2,599 of 2,978 batches of 3,000 events with the real
    /// statistics).
    fn check_budget_of_padded_rows(&self) -> Result<()> {
        let BatchLayout::Padded { max_doms, .. } = self.layout else {
            return Ok(());
        };
        let (Batching::Tokens { max_tokens, .. }, LengthGrouping::Doms { cap }) =
            (self.sampler.batching, self.sampler.group_by_length)
        else {
            return Ok(());
        };
        let (given, side, effect) = match cap {
            Some(cap) if cap == max_doms && max_tokens < max_doms => {
                return Err(Error::config(
                    "max_tokens",
                    format!(
                        "{max_tokens}, under the padded layout's max_doms {max_doms}: an event \
                         of more than {max_tokens} DOMs would form a batch alone, a grid of up \
                         to {max_doms} rows over the budget; give max_tokens of at least \
                         {max_doms}, or max_doms and group_by_length of {max_tokens}"
                    ),
                ))
            }
            Some(cap) if cap == max_doms => return Ok(()),
            Some(cap) if cap < max_doms => (
                format!("a cap of {cap}"),
                "under",
                format!(
                    "would count {cap} rows where it fills up to {max_doms}, and grids would \
                     overrun max_tokens"
                ),
            ),
            over => (
                over.map_or("uncapped".to_string(), |cap| format!("a cap of {cap}")),
                "over",
                "would count rows it never fills, and batches of long events would hold a \
                 fraction of max_tokens"
                    .to_string(),
            ),
        };
        let problem = format!(
            "{given}, {side} the padded layout's max_doms {max_doms}: an event of more DOMs \
             {effect}"
        );
        Err(Error::config(
            "group_by_length",
            format!(
                "{problem}; a token budget of padded DOM rows counts an event's DOMs as the \
                 grid keeps them: give group_by_length={max_doms}"
            ),
        ))
    }
}

/// Starts a loader thread named `name` (`top -H`, `py-spy` and debuggers show it). Like
/// `std::thread::spawn`, it panics only when the system cannot make a thread at all.
fn spawn_named<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(work)
        .unwrap_or_else(|e| panic!("cannot start the loader's {name} thread: {e}"))
}

fn default_device_buffers() -> usize {
    2
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            sampler: SamplerConfig::default(),
            layout: BatchLayout::Packed,
            workers: 2,
            prefetch: None,
            device: DeviceChoice::Auto,
            device_buffers: default_device_buffers(),
            time_copies: false,
            dom_positions: default_dom_positions(),
            worker_scheduling: WorkerScheduling::default(),
            consumer_gathers: default_consumer_gathers(),
            prefetch_level: None,
            columns_passes: None,
        }
    }
}

/// A loader's position, saved by a training job and given back to resume exactly, at the same
/// world size or another ([`Loader::resume`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Epoch and batches taken in it.
    pub position: SamplerState,
    /// The sampler configuration the position refers to. (The layout is not recorded: it
    /// does not change which events come in which order, so a job may resume in another.)
    pub sampler: SamplerConfig,
    /// The events the position refers to: [`View::identity`] of the loader's dataset or
    /// split. Absent from states saved before it was recorded, which resume unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
}

/// Streams the batches of one epoch for one rank.
pub struct Loader {
    config: LoaderConfig,
    placement: Placement,
    pool: Arc<StagingPool>,
    delivery: Delivery,
    lending: Arc<Lending>,
    stop: Arc<Stop>,
    threads: Vec<JoinHandle<()>>,
    position: SamplerState,
    /// [`View::identity`] of the events it reads, for its [`LoaderState`].
    identity: String,
    finished: bool,
}

/// Where the consumer takes its batches from.
enum Delivery {
    /// On the CPU: straight from the workers, put back in order here.
    Host(InOrder),
    /// On a GPU: from the uploader thread, copies queued.
    Device {
        slots: Arc<DeviceSlots>,
        uploaded: Receiver<Uploaded>,
    },
}

/// Initial staging buffer size in bytes; buffers grow to the largest batch seen.
const INITIAL_BUFFER_BYTES: usize = 1 << 20;

impl Loader {
    /// Starts at `position` (for a fresh epoch, [`SamplerState::start`]) on the configured
    /// device, reading `dataset`: an `Arc<Dataset>` (every event) or a [`View`] of it (a
    /// split).
    pub fn new(
        dataset: impl Into<View>,
        config: LoaderConfig,
        position: SamplerState,
    ) -> Result<Loader> {
        let placement = Placement::resolve(config.device)?;
        Loader::on(dataset, config, position, placement)
    }

    /// As [`Loader::new`], on an already resolved device (one CUDA context shared by
    /// several loaders, or the consumer's own).
    pub fn on(
        dataset: impl Into<View>,
        config: LoaderConfig,
        position: SamplerState,
        placement: Placement,
    ) -> Result<Loader> {
        Loader::on_pool(dataset, config, position, placement, None)
    }

    /// As [`Loader::on`], gathering into the buffers of `pool` when given: the pool of an
    /// earlier loader with the same configuration and placement ([`Loader::staging_pool`]),
    /// so that a job that starts epoch after epoch, or seeks, allocates its staging buffers
    /// once (pinned ones, on a GPU, are dear) and keeps their grown sizes. Buffers of the
    /// earlier loader still in flight went back to the pool when it was dropped; those its
    /// consumer still holds go back when they are freed.
    pub fn on_pool(
        dataset: impl Into<View>,
        config: LoaderConfig,
        position: SamplerState,
        placement: Placement,
        pool: Option<Arc<StagingPool>>,
    ) -> Result<Loader> {
        let view = dataset.into();
        let identity = view.identity();
        // Resolved once, here, so that a bad environment variable is an error now and every
        // gathering thread prefetches and copies alike; validated resolved, so the
        // environment is read once.
        let config = LoaderConfig {
            prefetch_level: Some(config.resolved_prefetch_level()?),
            columns_passes: Some(config.resolved_columns_passes()?),
            ..config
        };
        config.validate()?;
        let (allocate, slots): (Allocator, _) = match placement.cuda() {
            Some(device) => (
                device.staging_allocator(),
                Some(DeviceSlots::new(
                    device.clone(),
                    config.device_buffers,
                    config.time_copies,
                )),
            ),
            None => (plain_allocator(), None),
        };
        // Resolved once (the default reads the cores): the pool and its budget agree on it.
        let ahead = config.batches_ahead();
        let pool = match pool {
            Some(pool) => pool,
            None => {
                check_staging_fits_with(&view, &config, ahead, &placement)?;
                let count = config.staging_buffers_with(ahead, &placement);
                Arc::new(StagingPool::new(count, INITIAL_BUFFER_BYTES, allocate))
            }
        };
        let stop = Arc::new(Stop::new());
        let lending = Arc::new(Lending::new(GatherPermits::for_loader(
            config.workers,
            crate::cores::available_cores(),
        )));
        // Unbounded: the staging pool already bounds the batches in flight (a worker takes
        // a buffer before a plan). A queue bounded at `ahead` made the worker holding the
        // oldest batch block on it, full of later batches, and then wait for a core to be
        // woken while the consumer could deliver nothing: on 2 cores unbounded delivered
        // 0.3-2.1% more events/s in each of 12 paired comparisons at windows 1-64
        // (docs/results.md, "What the workers wait for").
        let (result_tx, results) = unbounded();
        let mut threads = Vec::new();
        {
            let (view, config, pool, stop, lending) = (
                view.clone(),
                config.clone(),
                pool.clone(),
                stop.clone(),
                lending.clone(),
            );
            threads.push(spawn_named(GATHER_THREAD_NAME, move || {
                run_workers(&view, &config, position, &pool, result_tx, &stop, &lending)
            }));
        }
        let order = InOrder::new(results, lending.clone());
        let delivery = match slots {
            None => Delivery::Host(order),
            Some(slots) => {
                let (uploaded_tx, uploaded) = unbounded();
                let for_thread = slots.clone();
                threads.push(spawn_named(UPLOAD_THREAD_NAME, move || {
                    upload_batches(order, for_thread, uploaded_tx)
                }));
                Delivery::Device { slots, uploaded }
            }
        };
        Ok(Loader {
            config,
            placement,
            pool,
            delivery,
            lending,
            stop,
            threads,
            position,
            identity,
            finished: false,
        })
    }

    /// Resumes from a state saved by any rank of any world size (elastic: see
    /// [`SamplerState::resumed`]): this rank continues from the global position the saved
    /// world had reached. Refuses a state whose order settings differ, naming the field
    /// ([`SamplerConfig::check_resumable`]), and one saved reading other events (the
    /// `dataset` field, [`View::check_identity`]); world, rank and `drop_last` may differ.
    pub fn resume(
        dataset: impl Into<View>,
        config: LoaderConfig,
        state: &LoaderState,
    ) -> Result<Loader> {
        config.sampler.check_resumable(&state.sampler)?;
        let dataset = dataset.into();
        if let Some(saved) = &state.dataset {
            dataset.check_identity(saved)?;
        }
        let position = state.position.resumed(state.sampler.world);
        Loader::new(dataset, config, position)
    }

    /// Where the loader stands: after the last batch handed out (the next epoch's start once
    /// the epoch is over).
    pub fn state(&self) -> LoaderState {
        LoaderState {
            position: self.current_position(),
            sampler: self.config.sampler.clone(),
            dataset: Some(self.identity.clone()),
        }
    }

    /// [`Loader::state`]'s position alone, without the settings and identity it copies
    /// (named apart from `Iterator::position`): what a caller asks after every batch.
    pub fn current_position(&self) -> SamplerState {
        self.position
    }

    /// The device batches go to (and, on the CPU, why).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Staging buffers allocated so far by its pool (constant in the steady state; counted
    /// since the pool was made, earlier loaders' allocations included when it was handed on
    /// with [`Loader::on_pool`]).
    pub fn staging_allocations(&self) -> u64 {
        self.pool.allocations()
    }

    /// Its staging pool, to hand on to the next loader ([`Loader::on_pool`]).
    pub fn staging_pool(&self) -> &Arc<StagingPool> {
        &self.pool
    }

    /// Batches of this loader gathered by the thread that waited for them
    /// ([`LoaderConfig::consumer_gathers`]), not by a worker.
    pub fn gathered_while_waiting(&self) -> u64 {
        self.lending.gathered()
    }

    /// The most threads that gathered at once so far, and how many may: as many as the
    /// workers, or the cores where there are more cores, the waiting thread included
    /// (it gathers in a worker's place, never beside all of them).
    pub fn most_gathering_at_once(&self) -> (usize, usize) {
        let permits = self.lending.permits();
        (permits.most_held(), permits.count())
    }

    /// Device buffer allocations so far (0 on the CPU; constant in the steady state).
    pub fn device_allocations(&self) -> u64 {
        match &self.delivery {
            Delivery::Host(_) => 0,
            Delivery::Device { slots, .. } => slots.allocations(),
        }
    }

    /// The next batch, with its copy queued on a GPU, waiting until `deadline` (forever
    /// without one).
    fn next_delivered(
        &mut self,
        deadline: Option<Instant>,
    ) -> Arrival<Result<(Filled, Option<DeviceCopy>)>> {
        match &mut self.delivery {
            Delivery::Host(order) => match order.next_until(deadline) {
                Arrival::Ready(next) => Arrival::Ready(next.map(|filled| (filled, None))),
                Arrival::NotYet => Arrival::NotYet,
                Arrival::Finished => Arrival::Finished,
            },
            Delivery::Device { slots, uploaded } => {
                let received = match uploaded.try_recv() {
                    Ok(next) => Ok(next),
                    Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
                    Err(TryRecvError::Empty) => {
                        // Blocked: the uploader may need to know (if we hold every slot).
                        slots.set_consumer_waiting(true);
                        let next = match deadline {
                            None => uploaded.recv().map_err(|_| RecvTimeoutError::Disconnected),
                            Some(deadline) => uploaded.recv_deadline(deadline),
                        };
                        slots.set_consumer_waiting(false);
                        next
                    }
                };
                match received {
                    Ok(next) => Arrival::Ready(next.map(|(filled, copy)| (filled, Some(copy)))),
                    Err(RecvTimeoutError::Timeout) => Arrival::NotYet,
                    Err(RecvTimeoutError::Disconnected) => Arrival::Finished,
                }
            }
        }
    }

    /// The next batch, waiting at most `wait` for it: [`Arrival::NotYet`] lets a caller
    /// that must stay responsive (a Python thread checking for Ctrl-C) ask again. The
    /// iterator's `next` is this without a limit.
    pub fn next_within(&mut self, wait: Duration) -> Arrival<Result<Batch>> {
        self.next_until(Instant::now().checked_add(wait))
    }

    fn next_until(&mut self, deadline: Option<Instant>) -> Arrival<Result<Batch>> {
        if self.finished {
            return Arrival::Finished;
        }
        match self.next_delivered(deadline) {
            Arrival::NotYet => Arrival::NotYet,
            Arrival::Finished => {
                // Every thread is done: the epoch is over.
                self.finished = true;
                self.position = SamplerState::start(self.position.epoch + 1);
                Arrival::Finished
            }
            Arrival::Ready(Ok((filled, device))) => {
                self.position.batches_taken += 1;
                self.pool.lend();
                Arrival::Ready(Ok(Batch::new(
                    filled,
                    device,
                    self.pool.clone(),
                    self.config.layout,
                )))
            }
            Arrival::Ready(Err(e)) => {
                self.finished = true;
                Arrival::Ready(Err(e))
            }
        }
    }
}

/// The exact number of batches `config.rank` gets in `epoch` of `dataset` when the ranks
/// deal the global batches from `origin` on (0: what a [`Loader`] started at the epoch's
/// beginning yields; see [`SamplerState`]). Free with an event-count batching; with a pulse
/// budget, one pass over the epoch's order reading the shards' offsets.
pub fn rank_batch_count(
    dataset: &View,
    config: &SamplerConfig,
    epoch: u64,
    origin: u64,
) -> Result<u64> {
    let sizes = DatasetSizes::new(dataset);
    let count = sampler::rank_batch_count(&sizes, config, epoch, origin);
    match sizes.take_error() {
        Some(e) => Err(e),
        None => Ok(count),
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        match self.next_until(None) {
            Arrival::Ready(batch) => Some(batch),
            Arrival::NotYet | Arrival::Finished => None,
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop.request();
        match &mut self.delivery {
            Delivery::Host(order) => order.clear(),
            Delivery::Device { slots, .. } => slots.stop(),
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        if let Delivery::Device { slots, uploaded } = &self.delivery {
            // Queued copies still read their staging buffers: let them finish first.
            let _ = slots.device().copy_stream().synchronize();
            while uploaded.try_recv().is_ok() {}
        }
    }
}
