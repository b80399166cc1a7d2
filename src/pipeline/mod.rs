//! The loader: threads and channels from the sampler to delivered batches.
//!
//! ```text
//! planner thread --plans--> worker threads --filled buffers--> consumer (in order)
//!   (sampler)        (bounded)  (gather into staging)   (bounded: prefetch)
//!                                                          |
//!                            on a GPU: copy stream -> device slots (double-buffered)
//! ```
//! A worker takes a free staging buffer *before* it takes the next plan, so the oldest
//! batch in flight always owns a buffer and reordering can never starve it. On a GPU the
//! staging buffers are pinned, and the consumer's thread queues each batch's copy onto the
//! device's copy stream ([`crate::device::transfer`]) one step ahead: when batch n is
//! handed out, the copy of batch n+1 is already queued, so it runs while the consumer's
//! GPU work on batch n does. Dropping a [`Batch`] returns its buffers; dropping the
//! [`Loader`] stops and joins every thread. Errors (a corrupt or missing shard, a failed
//! driver call) come out of the iterator.

mod delivered;
mod workers;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender};
use serde::{Deserialize, Serialize};

pub use delivered::{Batch, DeviceSection, PackedView, PaddedView};

use crate::batch::BatchLayout;
use crate::dataset::Dataset;
use crate::device::staging::{Allocator, HostMemory, PlainMemory, StagingPool};
use crate::device::transfer::{DeviceCopy, DeviceSlots};
use crate::device::{DeviceChoice, Placement};
use crate::error::{Error, Result};
use crate::sampler::{SamplerConfig, SamplerState};
use workers::{gather_batches, plan_epoch, Filled};

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
            prefetch: 4,
            device: DeviceChoice::Auto,
            device_buffers: default_device_buffers(),
            time_copies: false,
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

/// Streams the batches of one epoch for one rank.
pub struct Loader {
    config: LoaderConfig,
    placement: Placement,
    pool: Arc<StagingPool>,
    results: Receiver<(u64, Result<Filled>)>,
    stop: Option<Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    pending: BTreeMap<u64, Result<Filled>>,
    next_seq: u64,
    /// Device buffers, on a GPU.
    slots: Option<Arc<DeviceSlots>>,
    /// Batches whose copy is queued, oldest first (errors keep their place).
    in_flight: VecDeque<Result<(Filled, DeviceCopy)>>,
    position: SamplerState,
    finished: bool,
}

/// Initial staging buffer size in bytes; buffers grow to the largest batch seen.
const INITIAL_BUFFER_BYTES: usize = 1 << 20;

impl Loader {
    /// Starts epoch `state.epoch` at batch `state.batches_taken` (0 for a fresh epoch) on
    /// the configured device.
    pub fn new(
        dataset: Arc<Dataset>,
        config: LoaderConfig,
        position: SamplerState,
    ) -> Result<Loader> {
        let placement = Placement::resolve(config.device)?;
        Loader::on(dataset, config, position, placement)
    }

    /// As [`Loader::new`], on an already resolved device (one CUDA context shared by
    /// several loaders, or the consumer's own).
    pub fn on(
        dataset: Arc<Dataset>,
        config: LoaderConfig,
        position: SamplerState,
        placement: Placement,
    ) -> Result<Loader> {
        config.sampler.validate().map_err(Error::Config)?;
        if config.workers == 0 || config.prefetch == 0 {
            return Err(Error::Config(
                "workers and prefetch must be at least 1".into(),
            ));
        }
        let (allocate, slots): (Allocator, _) = match placement.cuda() {
            Some(device) => (
                device.staging_allocator(),
                Some(DeviceSlots::new(
                    device.clone(),
                    config.device_buffers,
                    config.time_copies,
                )),
            ),
            None => (
                Arc::new(|n| Box::new(PlainMemory::new(n)) as Box<dyn HostMemory>),
                None,
            ),
        };
        let device_buffers = slots.as_ref().map_or(0, |s| s.target());
        let pool = Arc::new(StagingPool::new(
            config.workers + config.prefetch + device_buffers + 2,
            INITIAL_BUFFER_BYTES,
            allocate,
        ));
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let (plan_tx, plan_rx) = bounded(config.workers);
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
            placement,
            pool,
            results,
            stop: Some(stop_tx),
            threads,
            pending: BTreeMap::new(),
            next_seq: 0,
            slots,
            in_flight: VecDeque::new(),
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

    /// The device batches go to (and, on the CPU, why).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Staging buffers allocated so far (constant in the steady state).
    pub fn staging_allocations(&self) -> u64 {
        self.pool.allocations()
    }

    /// Device buffer allocations so far (0 on the CPU; constant in the steady state).
    pub fn device_allocations(&self) -> u64 {
        self.slots.as_ref().map_or(0, |s| s.allocations())
    }

    /// The next gathered batch in order: waits for it when `wait`, else only takes what
    /// has arrived. `None`: the epoch is over (or, without `wait`, nothing is ready).
    fn next_filled(&mut self, wait: bool) -> Option<Result<Filled>> {
        loop {
            if let Some(result) = self.pending.remove(&self.next_seq) {
                self.next_seq += 1;
                return Some(result);
            }
            let received = if wait {
                self.results.recv().ok()
            } else {
                // Empty or disconnected alike: nothing more right now.
                self.results.try_recv().ok()
            };
            let (seq, result) = received?;
            self.pending.insert(seq, result);
        }
    }

    /// Queues the copy of the next batches while device buffers are free, and returns the
    /// oldest one queued (waiting for the first gather if nothing is queued).
    fn next_on_device(&mut self, slots: &Arc<DeviceSlots>) -> Option<Result<(Filled, DeviceCopy)>> {
        if self.in_flight.is_empty() {
            let filled = self.next_filled(true)?;
            self.in_flight.push_back(upload(slots, filled));
        }
        while self.in_flight.len() < slots.target()
            && self.in_flight.back().is_some_and(|b| b.is_ok())
            && slots.has_room()
        {
            let Some(filled) = self.next_filled(false) else {
                break;
            };
            self.in_flight.push_back(upload(slots, filled));
        }
        self.in_flight.pop_front()
    }
}

/// Queues the copy of a gathered batch (errors pass through).
fn upload(slots: &Arc<DeviceSlots>, filled: Result<Filled>) -> Result<(Filled, DeviceCopy)> {
    let filled = filled?;
    if !filled.buffer.is_pinned() {
        tracing::debug!(
            "batch {} is copied from pageable memory",
            filled.plan.global_index
        );
    }
    let copy = slots.upload(&filled.buffer.bytes()[..filled.sections.total])?;
    Ok((filled, copy))
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.finished {
            return None;
        }
        let next = match self.slots.clone() {
            Some(slots) => self
                .next_on_device(&slots)
                .map(|r| r.map(|(filled, copy)| (filled, Some(copy)))),
            None => self
                .next_filled(true)
                .map(|r| r.map(|filled| (filled, None))),
        };
        let Some(next) = next else {
            // Every thread is done: the epoch is over.
            self.finished = true;
            self.position = SamplerState {
                epoch: self.position.epoch + 1,
                batches_taken: 0,
            };
            return None;
        };
        Some(match next {
            Ok((filled, device)) => {
                self.position.batches_taken += 1;
                self.pool.lend();
                Ok(Batch::new(
                    filled,
                    device,
                    self.pool.clone(),
                    self.config.layout,
                ))
            }
            Err(e) => {
                self.finished = true;
                Err(e)
            }
        })
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
        if let Some(slots) = &self.slots {
            // Queued copies still read their staging buffers: let them finish first.
            let _ = slots.device().copy_stream().synchronize();
        }
        self.in_flight.clear();
    }
}
