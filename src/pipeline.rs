//! The loader: threads and channels from the sampler to delivered batches.
//!
//! ```text
//! planner thread --plans--> worker threads --filled buffers--> consumer (in order)
//!   (sampler)        (bounded)  (gather into staging)   (bounded: prefetch)
//! ```
//! A worker takes a free staging buffer *before* it takes the next plan, so the oldest
//! batch in flight always owns a buffer and reordering can never starve it. Dropping a
//! [`Batch`] returns its buffer to the pool; dropping the [`Loader`] stops and joins every
//! thread. Errors (a corrupt or missing shard) come out of the iterator, naming the shard.

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, select, Receiver, Sender};
use serde::{Deserialize, Serialize};

use crate::batch::{plan_sections, sections, BatchLayout, BatchShape, Gatherer, Sections};
use crate::dataset::Dataset;
use crate::device::staging::{HostMemory, PlainMemory, StagingBuffer, StagingPool};
use crate::error::{Error, Result};
use crate::format::pod::try_cast;
use crate::format::safetensors::Dtype;
use crate::format::shard::{FloatColumn, IntColumn};
use crate::sampler::{BatchPlan, EpochBatches, EventRef, EventSizes, SamplerConfig, SamplerState};

/// How a loader runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderConfig {
    /// Order, batching and partition.
    pub sampler: SamplerConfig,
    /// Batch layout.
    pub layout: BatchLayout,
    /// Gathering threads.
    pub workers: usize,
    /// Batches prepared ahead of the consumer.
    pub prefetch: usize,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            sampler: SamplerConfig::default(),
            layout: BatchLayout::Packed,
            workers: 2,
            prefetch: 4,
        }
    }
}

/// A loader's position, saved by a training job and given back to resume exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Epoch and batches taken in it.
    pub position: SamplerState,
    /// The sampler configuration the position refers to.
    pub sampler: SamplerConfig,
    /// The layout (does not change the order, recorded for the record).
    pub layout: BatchLayout,
}

/// A shard's `event_dom_offsets` and `dom_pulse_offsets`; `None` when it failed to open.
type ShardOffsets<'a> = Option<(&'a [i64], &'a [i64])>;

/// The sampler's view of a dataset's sizes, reading offsets straight from the shards.
struct DatasetSizes<'a> {
    dataset: &'a Dataset,
    offsets: Vec<OnceCell<ShardOffsets<'a>>>,
    error: OnceCell<Error>,
}

impl<'a> DatasetSizes<'a> {
    fn new(dataset: &'a Dataset) -> Self {
        DatasetSizes {
            dataset,
            offsets: (0..dataset.shard_count())
                .map(|_| OnceCell::new())
                .collect(),
            error: OnceCell::new(),
        }
    }
}

impl EventSizes for DatasetSizes<'_> {
    fn shard_events(&self) -> Vec<usize> {
        self.dataset
            .manifest()
            .shards
            .iter()
            .map(|s| s.events as usize)
            .collect()
    }

    fn pulses(&self, e: EventRef) -> usize {
        let offsets = self.offsets[e.shard as usize].get_or_init(|| {
            match self.dataset.shard(e.shard as usize).and_then(|s| s.view()) {
                Ok(v) => Some((v.event_dom_offsets, v.dom_pulse_offsets)),
                Err(err) => {
                    let _ = self.error.set(err);
                    None
                }
            }
        });
        offsets.map_or(0, |(events, doms)| {
            let i = e.index as usize;
            (doms[events[i + 1] as usize] - doms[events[i] as usize]) as usize
        })
    }
}

/// A gathered batch on its way to the consumer.
struct Filled {
    buffer: StagingBuffer,
    sections: Sections,
    plan: BatchPlan,
    shape: BatchShape,
    gather_seconds: f64,
}

/// Streams the batches of one epoch for one rank.
pub struct Loader {
    config: LoaderConfig,
    pool: Arc<StagingPool>,
    results: Receiver<(u64, Result<Filled>)>,
    stop: Option<Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    pending: BTreeMap<u64, Result<Filled>>,
    next_seq: u64,
    position: SamplerState,
    finished: bool,
}

/// Initial staging buffer size in bytes; buffers grow to the largest batch seen.
const INITIAL_BUFFER_BYTES: usize = 1 << 20;

impl Loader {
    /// Starts epoch `state.epoch` at batch `state.batches_taken` (0 for a fresh epoch).
    pub fn new(
        dataset: Arc<Dataset>,
        config: LoaderConfig,
        position: SamplerState,
    ) -> Result<Loader> {
        config.sampler.validate().map_err(Error::Config)?;
        if config.workers == 0 || config.prefetch == 0 {
            return Err(Error::Config(
                "workers and prefetch must be at least 1".into(),
            ));
        }
        let allocate = Arc::new(|n| Box::new(PlainMemory::new(n)) as Box<dyn HostMemory>);
        let pool = Arc::new(StagingPool::new(
            config.workers + config.prefetch + 2,
            INITIAL_BUFFER_BYTES,
            allocate,
        ));
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let (plan_tx, plan_rx) = bounded::<(u64, Result<BatchPlan>)>(config.workers);
        let (result_tx, results) = bounded(config.prefetch);
        let mut threads = Vec::new();
        {
            let (dataset, sampler, stop) =
                (dataset.clone(), config.sampler.clone(), stop_rx.clone());
            threads.push(std::thread::spawn(move || {
                plan_epoch(&dataset, &sampler, position, plan_tx, stop)
            }));
        }
        for _ in 0..config.workers {
            let (dataset, pool, plans, results, stop) = (
                dataset.clone(),
                pool.clone(),
                plan_rx.clone(),
                result_tx.clone(),
                stop_rx.clone(),
            );
            let layout = config.layout;
            threads.push(std::thread::spawn(move || {
                gather_batches(&dataset, layout, &pool, plans, results, stop)
            }));
        }
        Ok(Loader {
            config,
            pool,
            results,
            stop: Some(stop_tx),
            threads,
            pending: BTreeMap::new(),
            next_seq: 0,
            position,
            finished: false,
        })
    }

    /// Resumes from a saved state; refuses a state made with another sampler configuration.
    pub fn resume(
        dataset: Arc<Dataset>,
        config: LoaderConfig,
        state: &LoaderState,
    ) -> Result<Loader> {
        if state.sampler != config.sampler {
            return Err(Error::Config(format!(
                "the saved state was made with sampler {:?}, not {:?}",
                state.sampler, config.sampler
            )));
        }
        Loader::new(dataset, config, state.position)
    }

    /// Where the loader stands: after the last batch handed out (the next epoch's start once
    /// the epoch is over).
    pub fn state(&self) -> LoaderState {
        LoaderState {
            position: self.position,
            sampler: self.config.sampler.clone(),
            layout: self.config.layout,
        }
    }

    /// Staging buffers allocated so far (constant in the steady state).
    pub fn staging_allocations(&self) -> u64 {
        self.pool.allocations()
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.finished {
            return None;
        }
        loop {
            if let Some(result) = self.pending.remove(&self.next_seq) {
                self.next_seq += 1;
                return Some(match result {
                    Ok(Filled {
                        buffer,
                        sections,
                        plan,
                        shape,
                        gather_seconds,
                    }) => {
                        self.position.batches_taken += 1;
                        self.pool.lend();
                        Ok(Batch {
                            buffer: Some(buffer),
                            pool: self.pool.clone(),
                            sections,
                            plan,
                            shape,
                            gather_seconds,
                            layout: self.config.layout,
                        })
                    }
                    Err(e) => {
                        self.finished = true;
                        Err(e)
                    }
                });
            }
            match self.results.recv() {
                Ok((seq, result)) => {
                    self.pending.insert(seq, result);
                }
                Err(_) => {
                    // Every thread is done: the epoch is over.
                    self.finished = true;
                    self.position = SamplerState {
                        epoch: self.position.epoch + 1,
                        batches_taken: 0,
                    };
                    return None;
                }
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        drop(self.stop.take());
        self.pending.clear();
        while self.results.try_recv().is_ok() {}
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn plan_epoch(
    dataset: &Dataset,
    sampler: &SamplerConfig,
    position: SamplerState,
    plans: Sender<(u64, Result<BatchPlan>)>,
    stop: Receiver<()>,
) {
    let sizes = DatasetSizes::new(dataset);
    let batches = EpochBatches::new(&sizes, sampler, position.epoch, position.batches_taken);
    for (seq, plan) in batches.enumerate() {
        let item = match sizes.error.get() {
            Some(e) => Err(Error::shard(dataset.dir(), e.to_string())),
            None => Ok(plan),
        };
        let failed = item.is_err();
        select! {
            send(plans, (seq as u64, item)) -> sent => if sent.is_err() { return },
            recv(stop) -> _ => return,
        }
        if failed {
            return;
        }
    }
}

fn gather_batches(
    dataset: &Dataset,
    layout: BatchLayout,
    pool: &StagingPool,
    plans: Receiver<(u64, Result<BatchPlan>)>,
    results: Sender<(u64, Result<Filled>)>,
    stop: Receiver<()>,
) {
    let mut gatherer = Gatherer::new(dataset);
    let types = dataset.manifest().schema.types;
    loop {
        let mut buffer = select! {
            recv(pool.free()) -> b => match b { Ok(b) => b, Err(_) => return },
            recv(stop) -> _ => return,
        };
        let (seq, plan) = select! {
            recv(plans) -> p => match p { Ok(p) => p, Err(_) => { pool.give_back(buffer); return } },
            recv(stop) -> _ => return,
        };
        let started = std::time::Instant::now();
        let filled = plan.and_then(|plan| {
            let shape = gatherer.shape(&plan)?;
            let sections = plan_sections(layout, shape, &types);
            pool.ensure_capacity(&mut buffer, sections.total);
            gatherer.gather(&plan, layout, &sections, buffer.bytes_mut())?;
            Ok((sections, plan, shape))
        });
        let item = match filled {
            Ok((sections, plan, shape)) => {
                let gather_seconds = started.elapsed().as_secs_f64();
                Ok(Filled {
                    buffer,
                    sections,
                    plan,
                    shape,
                    gather_seconds,
                })
            }
            Err(e) => {
                pool.give_back(buffer);
                Err(e)
            }
        };
        select! {
            send(results, (seq, item)) -> sent => if sent.is_err() { return },
            recv(stop) -> _ => return,
        }
    }
}

/// One delivered batch; dropping it returns its buffer to the pool.
pub struct Batch {
    buffer: Option<StagingBuffer>,
    pool: Arc<StagingPool>,
    sections: Sections,
    plan: BatchPlan,
    shape: BatchShape,
    gather_seconds: f64,
    layout: BatchLayout,
}

/// The packed (CSR) view of a host batch.
#[derive(Debug, Clone, Copy)]
pub struct PackedView<'a> {
    /// `[B]`.
    pub event_id: &'a [i64],
    /// `[B]` (NaN without labels).
    pub event_azimuth: &'a [f64],
    /// `[B]` (NaN without labels).
    pub event_zenith: &'a [f64],
    /// `[B+1]`.
    pub event_dom_offsets: &'a [i32],
    /// `[D+1]`.
    pub dom_pulse_offsets: &'a [i32],
    /// `[D]`.
    pub dom_sensor_id: IntColumn<'a>,
    /// `[D*3]`.
    pub dom_position: FloatColumn<'a>,
    /// `[P]`.
    pub pulse_time: IntColumn<'a>,
    /// `[P]`.
    pub pulse_charge: FloatColumn<'a>,
    /// `[P]`.
    pub pulse_auxiliary: &'a [u8],
}

/// The padded (DOM-flat) view of a host batch.
#[derive(Debug, Clone, Copy)]
pub struct PaddedView<'a> {
    /// `[B]`.
    pub event_id: &'a [i64],
    /// `[B]`.
    pub event_azimuth: &'a [f64],
    /// `[B]`.
    pub event_zenith: &'a [f64],
    /// `[B, M, F]`, row-major.
    pub dom_features: &'a [f32],
    /// `[B, M]`, 1 where a DOM is present.
    pub dom_mask: &'a [u8],
    /// `M`.
    pub max_doms: usize,
    /// `F`.
    pub features_per_dom: usize,
}

impl Batch {
    /// The buffer's bytes (sections at their offsets).
    pub fn bytes(&self) -> &[u8] {
        &self
            .buffer
            .as_ref()
            .expect("buffer held until drop")
            .bytes()[..self.sections.total]
    }

    /// The section table.
    pub fn sections(&self) -> &Sections {
        &self.sections
    }

    /// Which events, in order, and the batch's global number in the epoch.
    pub fn plan(&self) -> &BatchPlan {
        &self.plan
    }

    /// Seconds a worker spent gathering this batch (shard reads through the memory map
    /// included).
    pub fn gather_seconds(&self) -> f64 {
        self.gather_seconds
    }

    /// Events, DOMs and pulses in the batch.
    pub fn shape(&self) -> BatchShape {
        self.shape
    }

    /// The layout.
    pub fn layout(&self) -> BatchLayout {
        self.layout
    }

    fn section(&self, name: &str) -> &[u8] {
        let s = self.sections.get(name).expect("section of this layout");
        &self.bytes()[s.offset..s.offset + s.len]
    }

    fn typed<T: crate::format::pod::Pod>(&self, name: &str) -> &[T] {
        try_cast(self.section(name)).expect("sections are aligned")
    }

    fn dtype(&self, name: &str) -> Dtype {
        self.sections
            .get(name)
            .expect("section of this layout")
            .dtype
    }

    /// The packed view; `None` for a padded batch.
    pub fn packed(&self) -> Option<PackedView<'_>> {
        use sections::*;
        if self.layout != BatchLayout::Packed {
            return None;
        }
        let ints =
            |n| IntColumn::from_raw(self.section(n), self.dtype(n)).expect("integer section");
        let floats =
            |n| FloatColumn::from_raw(self.section(n), self.dtype(n)).expect("float section");
        Some(PackedView {
            event_id: self.typed(EVENT_ID),
            event_azimuth: self.typed(EVENT_AZIMUTH),
            event_zenith: self.typed(EVENT_ZENITH),
            event_dom_offsets: self.typed(EVENT_DOM_OFFSETS),
            dom_pulse_offsets: self.typed(DOM_PULSE_OFFSETS),
            dom_sensor_id: ints(DOM_SENSOR_ID),
            dom_position: floats(DOM_POSITION),
            pulse_time: ints(PULSE_TIME),
            pulse_charge: floats(PULSE_CHARGE),
            pulse_auxiliary: self.section(PULSE_AUXILIARY),
        })
    }

    /// The padded view; `None` for a packed batch.
    pub fn padded(&self) -> Option<PaddedView<'_>> {
        use sections::*;
        let shape = &self.sections.get(DOM_FEATURES)?.shape;
        Some(PaddedView {
            event_id: self.typed(EVENT_ID),
            event_azimuth: self.typed(EVENT_AZIMUTH),
            event_zenith: self.typed(EVENT_ZENITH),
            dom_features: self.typed(DOM_FEATURES),
            dom_mask: self.section(DOM_MASK),
            max_doms: shape[1],
            features_per_dom: shape[2],
        })
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.pool.return_lent(buffer);
        }
    }
}
