//! The pipeline's threads: a planner that runs the sampler, and workers that gather each
//! planned batch into a staging buffer.

use std::cell::OnceCell;

use crossbeam_channel::{select, Receiver, Sender};

use crate::batch::{plan_sections, BatchLayout, BatchShape, Gatherer, Sections};
use crate::dataset::Dataset;
use crate::device::staging::{StagingBuffer, StagingPool};
use crate::error::{Error, Result};
use crate::format::ShardView;
use crate::sampler::{BatchPlan, EpochBatches, EventRef, EventSizes, SamplerConfig, SamplerState};

/// The sampler's view of a dataset's sizes, reading offsets straight from the shards.
struct DatasetSizes<'a> {
    dataset: &'a Dataset,
    /// Each shard's view once opened; `None` when it failed to open.
    views: Vec<OnceCell<Option<ShardView<'a>>>>,
    error: OnceCell<Error>,
}

impl<'a> DatasetSizes<'a> {
    fn new(dataset: &'a Dataset) -> Self {
        DatasetSizes {
            dataset,
            views: (0..dataset.shard_count())
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
        let view = self.views[e.shard as usize].get_or_init(|| {
            match self.dataset.shard(e.shard as usize).and_then(|s| s.view()) {
                Ok(v) => Some(v),
                Err(err) => {
                    let _ = self.error.set(err);
                    None
                }
            }
        });
        view.as_ref()
            .map_or(0, |v| v.event_pulse_range(e.index as usize).len())
    }
}

/// A gathered batch on its way to the consumer.
pub(crate) struct Filled {
    pub(crate) buffer: StagingBuffer,
    pub(crate) sections: Sections,
    pub(crate) plan: BatchPlan,
    pub(crate) shape: BatchShape,
    pub(crate) gather_seconds: f64,
}

/// Runs the sampler for one epoch from `position`, sending numbered plans until the end,
/// an error, or a stop signal.
pub(crate) fn plan_epoch(
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

/// Takes a free buffer, then a plan, gathers, and sends the result; until the plans run
/// out or a stop signal.
pub(crate) fn gather_batches(
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
