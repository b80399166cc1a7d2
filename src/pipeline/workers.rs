//! The pipeline's workers: each takes the epoch's next batch plan from the sampler they
//! share and gathers it into a staging buffer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crossbeam_channel::{bounded, select, Receiver, Sender};

use super::helping::{Helper, Lending};
use super::permits::GatherPermits;
use super::plans::{NextPlan, Plans};
use super::scheduling::GATHER_THREAD_NAME;
use super::LoaderConfig;
use crate::batch::{plan_sections_into, BatchShape, ColumnsPasses, Gatherer, Sections};
use crate::dataset::{Dataset, DatasetSizes, View};
use crate::device::staging::{StagingBuffer, StagingPool};
use crate::error::Result;
use crate::prefetch::PrefetchLevel;
use crate::sampler::{BatchPlan, SamplerState};

/// A gathered batch on its way to the consumer.
pub(crate) struct Filled {
    pub(crate) buffer: StagingBuffer,
    pub(crate) sections: Sections,
    pub(crate) plan: BatchPlan,
    pub(crate) shape: BatchShape,
    pub(crate) gather_seconds: f64,
    /// Gathered by the thread waiting for batches ([`super::helping`]), not a worker.
    pub(crate) gathered_while_waiting: bool,
    /// Seconds its worker was blocked for a free staging buffer before gathering it (zero
    /// when the waiting thread gathered it: that one never waits for a buffer).
    pub(crate) buffer_wait_seconds: f64,
    /// Seconds its worker then waited for a gathering permit ([`GatherPermits`]; zero
    /// when the waiting thread gathered it: that one only takes a free one).
    pub(crate) permit_wait_seconds: f64,
    /// Seconds its thread spent planning a chunk of batches in the call that took its plan,
    /// before gathering it ([`NextPlan::planning_seconds`]).
    pub(crate) planning_seconds: f64,
}

/// Asks the pipeline's threads to stop: a flag they check between batches, and a channel
/// whose disconnection wakes the ones blocked on a channel.
pub(crate) struct Stop {
    requested: AtomicBool,
    /// Dropped by [`Stop::request`]: never sent on.
    sender: Mutex<Option<Sender<()>>>,
    signal: Receiver<()>,
}

impl Stop {
    /// A stop not yet requested.
    pub(crate) fn new() -> Stop {
        let (sender, signal) = bounded(0);
        Stop {
            requested: AtomicBool::new(false),
            sender: Mutex::new(Some(sender)),
            signal,
        }
    }

    /// Asks every thread to stop: at its next check, or at once if it is blocked.
    pub(crate) fn request(&self) {
        self.requested.store(true, Ordering::Release);
        drop(self.sender.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    pub(crate) fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }
}

/// Runs the epoch from `position` with `config.workers` gathering threads (this one and
/// `workers - 1` more), until the plans run out, an error, or a stop.
pub(crate) fn run_workers(
    view: &View,
    config: &LoaderConfig,
    position: SamplerState,
    pool: &StagingPool,
    results: Sender<(u64, Result<Filled>)>,
    stop: &Stop,
    lending: &Lending,
) {
    let sizes = DatasetSizes::new(view);
    let dataset = view.dataset();
    let workers = config.workers;
    let plans = Plans::new(view, &sizes, config, position);
    let permits = lending.permits();
    // This thread gathers too (it is named as a gathering thread where it is spawned); the
    // ones it starts below inherit its policy (Linux threads start under their creator's).
    if let Err(e) = config.worker_scheduling.apply_to_current_thread() {
        // Said once: every epoch's threads would meet the same refusal.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                "gathering threads keep the process's scheduling policy ({} refused: {e})",
                config.worker_scheduling.name()
            )
        });
    }
    let gather_all = || {
        std::thread::scope(|scope| {
            for _ in 1..workers {
                let (plans, results) = (&plans, results.clone());
                let spawned = std::thread::Builder::new()
                    .name(GATHER_THREAD_NAME.to_string())
                    .spawn_scoped(scope, move || {
                        gather_batches(dataset, config, pool, plans, permits, results, stop)
                    });
                if let Err(e) = spawned {
                    // The threads already running gather the epoch; this one is not needed.
                    tracing::warn!("gathering thread not started: {e}");
                }
            }
            gather_batches(dataset, config, pool, &plans, permits, results, stop);
        })
    };
    if config.consumer_gathers {
        let helper = Helper {
            plans: &plans,
            gatherer: Mutex::new(gatherer(dataset, config)),
            config,
            pool,
            stop,
        };
        lending.lend_while(&helper, gather_all);
    } else {
        gather_all();
    }
}

/// A gatherer over `dataset` prefetching and copying as `config` says (the loader resolved
/// its level and passes when it started).
fn gatherer<'a>(dataset: &'a Dataset, config: &LoaderConfig) -> Gatherer<'a> {
    let level = config
        .prefetch_level
        .unwrap_or_else(PrefetchLevel::for_this_machine);
    let passes = config
        .columns_passes
        .unwrap_or_else(ColumnsPasses::for_this_machine);
    Gatherer::with_prefetch(dataset, level).with_columns_passes(passes)
}

/// Takes a free buffer (one last filled on this thread's CPU when there is one), then a
/// gathering permit, then a plan, gathers, and sends the result; until the plans run out,
/// an error, or a stop. The pool and the permits are tried first and only waited on (with
/// the stop signal) when none is free; the results' channel is unbounded (the pool bounds
/// the batches in flight), so a send never waits: the steady state takes no shared lock.
fn gather_batches(
    dataset: &Dataset,
    config: &LoaderConfig,
    pool: &StagingPool,
    plans: &Plans<'_>,
    permits: &GatherPermits,
    results: Sender<(u64, Result<Filled>)>,
    stop: &Stop,
) {
    let mut gatherer = gatherer(dataset, config);
    while !stop.requested() {
        let Some((mut buffer, waited)) = take_buffer(pool, stop) else {
            return;
        };
        let Some((permit, permit_waited)) = permits.acquire(&stop.signal) else {
            return;
        };
        let Some(next) = plans.next_in(&mut buffer) else {
            return; // the buffer and the permit go back as they drop
        };
        let seq = next.seq;
        let mut item = gather_plan(&mut gatherer, config, pool, plans, buffer, next);
        drop(permit);
        if let Ok(filled) = &mut item {
            filled.buffer_wait_seconds = waited;
            filled.permit_wait_seconds = permit_waited;
        }
        let failed = item.is_err();
        if results.send((seq, item)).is_err() || failed {
            return; // the consumer is gone, or the epoch ends at this error
        }
    }
}

/// A free staging buffer (one last filled on this thread's CPU when there is one) and the
/// seconds spent blocked for it; `None` at a stop. The clock is read only when none is free.
fn take_buffer(pool: &StagingPool, stop: &Stop) -> Option<(StagingBuffer, f64)> {
    free_now_or_blocked(pool.take_free(), pool.free(), &stop.signal, |buffer| buffer)
}

/// `now` when it holds one, with no time blocked; else the first that `wait` receives,
/// made into one by `made`, with the seconds spent blocked for it (the clock is read only
/// then); `None` once `stop` is signalled (its sender dropped) or `wait` disconnects first.
pub(super) fn free_now_or_blocked<T, R>(
    now: Option<T>,
    wait: &Receiver<R>,
    stop: &Receiver<()>,
    made: impl FnOnce(R) -> T,
) -> Option<(T, f64)> {
    if let Some(free) = now {
        return Some((free, 0.0));
    }
    let blocked = Instant::now();
    select! {
        recv(wait) -> received => received
            .ok()
            .map(|r| (made(r), blocked.elapsed().as_secs_f64())),
        recv(stop) -> _ => None,
    }
}

/// Gathers `next`'s plan into `buffer`, its section table written into the one `next`
/// holds (the table the buffer's last batch had, see
/// [`BatchVectors`](crate::device::staging::BatchVectors)), and passes its planning
/// seconds on; an error ends the epoch for every worker.
pub(crate) fn gather_plan(
    gatherer: &mut Gatherer<'_>,
    config: &LoaderConfig,
    pool: &StagingPool,
    plans: &Plans<'_>,
    mut buffer: StagingBuffer,
    next: NextPlan,
) -> Result<Filled> {
    let NextPlan {
        plan,
        mut sections,
        planning_seconds,
        ..
    } = next;
    let started = std::time::Instant::now();
    let types = plans.view.dataset().manifest().schema.types;
    let filled = plan.and_then(|plan| {
        let shape = gatherer.shape(&plan)?;
        // Refused before its buffer grows to it.
        shape.check_fits(config.layout)?;
        plan_sections_into(
            &mut sections,
            config.layout,
            shape,
            &types,
            config.dom_positions,
        );
        pool.ensure_capacity(&mut buffer, sections.total);
        gatherer.gather(&plan, config.layout, &sections, buffer.bytes_mut())?;
        buffer.mark_gathered_here();
        Ok((sections, plan, shape))
    });
    match filled {
        Ok((sections, plan, shape)) => Ok(Filled {
            buffer,
            sections,
            plan,
            shape,
            gather_seconds: started.elapsed().as_secs_f64(),
            gathered_while_waiting: false,
            buffer_wait_seconds: 0.0,
            permit_wait_seconds: 0.0,
            planning_seconds,
        }),
        Err(e) => {
            plans.fail();
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::device::staging::plain_allocator;

    const HELD: Duration = Duration::from_millis(50);

    #[test]
    fn a_worker_counts_the_time_it_waited_for_a_free_buffer() {
        let pool = StagingPool::new(1, 64, plain_allocator());
        let stop = Stop::new();
        let (_, free) = take_buffer(&pool, &stop).expect("the pool's one buffer");
        assert_eq!(free, 0.0, "a free buffer is taken without waiting");
        let held = pool.take_free().expect("it went back when dropped");
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| take_buffer(&pool, &stop).map(|(_, s)| s));
            std::thread::sleep(HELD);
            drop(held);
            let waited = waiter.join().unwrap().expect("the returned buffer");
            assert!(waited >= 0.9 * HELD.as_secs_f64(), "waited {waited} s");
        });
        // A stop wakes a worker waiting for a buffer, which then gives up.
        let held = pool.take_free().unwrap();
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| take_buffer(&pool, &stop).is_none());
            std::thread::sleep(HELD / 5);
            stop.request();
            assert!(waiter.join().unwrap(), "stopped instead of taking a buffer");
        });
        drop(held);
    }
}
