//! What a *resident* loader needs from the library: one rank's epoch as flat arrays.
//!
//! A resident loader (the Python package's `Loader(..., resident=True)`) holds every column
//! of the dataset in one set of concatenated tensors, on a GPU or in host memory, and
//! gathers each batch there with a fixed sequence of tensor operations. It takes its order
//! from this module, which runs the very sampler the streaming loader runs
//! ([`EpochBatches`]) and measures each batch the way the streaming gather does
//! ([`Gatherer::shape`]), so both loaders deliver the same batches for the same settings.
//!
//! The plan of an epoch holds, for the batches this rank takes from a position on:
//! - the events in delivery order, as **global positions** (the shards concatenated in
//!   manifest order: shard `s`'s event `i` is at `shard_start[s] + i`; in a [`View`] that
//!   keeps a part of the events, positions count the view's events, as
//!   [`gather_view_shard`] lays them out);
//! - where each batch starts among them, and each batch's DOMs, pulses and largest DOM
//!   count: every size a batch's gather needs, known on the host before it runs, so the
//!   gather never waits on the device to learn one.
//!
//! ```no_run
//! # fn main() -> shardify::Result<()> {
//! use shardify::dataset::{ChecksumPolicy, Dataset};
//! use shardify::resident::plan_epoch;
//! use shardify::sampler::{SamplerConfig, SamplerState};
//!
//! let dataset = std::sync::Arc::new(Dataset::open("ds".as_ref(), ChecksumPolicy::Lazy)?);
//! let config = SamplerConfig { window_blocks: 1 << 20, ..SamplerConfig::default() };
//! let plan = plan_epoch(&dataset.into(), &config, SamplerState::start(0))?;
//! for b in 0..plan.batches() {
//!     let events = plan.batch_events(b);   // global positions of batch b's events
//!     let (doms, pulses) = (plan.doms[b], plan.pulses[b]);
//! }
//! # Ok(())
//! # }
//! ```

use rayon::prelude::*;

use crate::batch::{plan_sections, BatchLayout, BatchShape, Gatherer, Sections};
use crate::dataset::{DatasetSizes, View};
use crate::device::staging::{HostMemory, PlainMemory};
use crate::error::Result;
use crate::sampler::{BatchPlan, EpochBatches, EventRef, SamplerConfig, SamplerState};

/// One rank's batches of one epoch, from a position on, as flat arrays (I64, ready to
/// become tensors).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochPlan {
    /// The epoch.
    pub epoch: u64,
    /// The batches of the epoch this rank had taken before the plan's first batch.
    pub first_batch: u64,
    /// Every planned event's global position (shards concatenated in manifest order), in
    /// delivery order.
    pub events: Vec<i64>,
    /// Batch `b` holds `events[starts[b]..starts[b + 1]]` (one more entry than batches).
    pub starts: Vec<i64>,
    /// DOMs of each batch.
    pub doms: Vec<i64>,
    /// Pulses of each batch.
    pub pulses: Vec<i64>,
    /// The largest DOM count of an event of each batch (the padded layout's width before
    /// its cap).
    pub max_doms: Vec<i64>,
}

impl EpochPlan {
    /// The number of batches planned.
    pub fn batches(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Batch `b`'s events (global positions, delivery order).
    pub fn batch_events(&self, b: usize) -> &[i64] {
        &self.events[self.starts[b] as usize..self.starts[b + 1] as usize]
    }

    /// Batch `b`'s shape.
    pub fn shape(&self, b: usize) -> BatchShape {
        BatchShape {
            events: (self.starts[b + 1] - self.starts[b]) as usize,
            doms: self.doms[b] as usize,
            pulses: self.pulses[b] as usize,
            max_doms: self.max_doms[b] as usize,
        }
    }

    /// Refuses the plan when one of its batches does not fit `layout`
    /// ([`BatchShape::check_fits`]): what a streaming loader checks batch by batch, checked
    /// once for a resident loader's epoch, before any of it is gathered.
    pub fn check_fits(&self, layout: BatchLayout) -> Result<()> {
        (0..self.batches()).try_for_each(|b| self.shape(b).check_fits(layout))
    }
}

/// The global position of each shard's first event (counting the view's events), and the
/// total at the end.
fn shard_starts(view: &View) -> Vec<i64> {
    let counts = view.shard_counts();
    let mut starts = Vec::with_capacity(counts.len() + 1);
    let mut total = 0i64;
    starts.push(0);
    for shard in counts {
        total += shard.events as i64;
        starts.push(total);
    }
    starts
}

/// The columns of the events `view` keeps in shard `shard`, in stored order, as one packed
/// batch (no `dom_position`; offsets from 0; labels NaN in an unlabelled dataset): what a
/// resident loader holds of that shard when the view keeps a part of its events. Built in
/// host memory, one shard at a time.
pub fn gather_view_shard(view: &View, shard: usize) -> Result<(Sections, PlainMemory)> {
    let dataset = view.dataset();
    let events: Vec<EventRef> = match view.kept(shard) {
        Some(kept) => kept
            .iter()
            .map(|index| EventRef {
                shard: shard as u32,
                index,
            })
            .collect(),
        None => (0..dataset.manifest().shards[shard].events as u32)
            .map(|index| EventRef {
                shard: shard as u32,
                index,
            })
            .collect(),
    };
    let plan = BatchPlan {
        global_index: 0,
        events,
    };
    let mut gatherer = Gatherer::new(dataset);
    let shape = gatherer.shape(&plan)?;
    let types = dataset.manifest().schema.types;
    let sections = plan_sections(BatchLayout::Packed, shape, &types, false);
    let mut memory = PlainMemory::new(sections.total);
    gatherer.gather(&plan, BatchLayout::Packed, &sections, memory.bytes_mut())?;
    Ok((sections, memory))
}

/// Batches the sampler hands over at a time to be measured (in parallel).
const CHUNK_BATCHES: usize = 1024;

/// The batches `config.rank` takes in `position.epoch` after the first
/// `position.batches_taken`: the same batches, in the same order, as a streaming
/// [`crate::pipeline::Loader`] started at `position` delivers. Reads the shards' offsets
/// (memory-mapped; checksummed on first touch under a lazy policy), never their columns.
///
/// The sampler runs on a thread of its own and hands its batches over in chunks, which the
/// threads of the current rayon pool measure meanwhile: the plan takes about as long as the
/// sampler's order alone once there are a few cores (`cargo bench --bench plan`).
pub fn plan_epoch(
    view: &View,
    config: &SamplerConfig,
    position: SamplerState,
) -> Result<EpochPlan> {
    config.validate()?;
    let dataset = view.dataset();
    let starts_of_shards = shard_starts(view);
    let sizes = DatasetSizes::without_read_ahead(view);
    let mut plan = EpochPlan {
        epoch: position.epoch,
        first_batch: position.batches_taken,
        starts: vec![0],
        ..EpochPlan::default()
    };
    let (chunks, planned) = crossbeam_channel::bounded::<Vec<BatchPlan>>(2);
    let sizes = &sizes;
    std::thread::scope(|scope| {
        // Moves the sender in: the channel closes when the sampler is done.
        let sampler = scope.spawn(move || {
            let mut batches = EpochBatches::new(sizes, config, position);
            loop {
                let chunk: Vec<BatchPlan> = batches.by_ref().take(CHUNK_BATCHES).collect();
                if chunk.is_empty() || chunks.send(chunk).is_err() {
                    return;
                }
            }
        });
        let measured = planned.iter().try_for_each(|chunk| {
            let shapes = chunk
                .par_iter()
                .map_init(
                    || (Gatherer::new(dataset), BatchPlan::default()),
                    |(gatherer, located), batch| {
                        // Measured in the shards' numbering (the view's is kept for the plan).
                        located.clone_from(batch);
                        view.locate_plan(located);
                        gatherer.shape(located)
                    },
                )
                .collect::<Result<Vec<BatchShape>>>()?;
            for (batch, shape) in chunk.iter().zip(shapes) {
                plan.events.extend(
                    batch
                        .events
                        .iter()
                        .map(|e| starts_of_shards[e.shard as usize] + i64::from(e.index)),
                );
                plan.starts.push(plan.events.len() as i64);
                plan.doms.push(shape.doms as i64);
                plan.pulses.push(shape.pulses as i64);
                plan.max_doms.push(shape.max_doms as i64);
            }
            Ok(())
        });
        drop(planned); // stops the sampler after an error
        sampler.join().expect("the sampler does not panic");
        measured
    })?;
    // A shard the sampler could not size (batching by pulses) is an error, not a plan.
    match sizes.take_error() {
        Some(e) => Err(e),
        None => Ok(plan),
    }
}
