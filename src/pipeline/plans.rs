//! The epoch's batch plans, shared by the threads that gather: planned a few batches at a
//! time by whichever thread finds too few ready, taken one at a time by every thread.
//!
//! Planned one batch per gather, in turn under a lock, each window of the sampler was built
//! and read on both cores, and each plan written where the other core had read the last.
//! Where the two cores share no L3 the sampler took twice its time alone in the loader
//! (docs/results.md, "Plans sixteen at a time"). Planned [`PLANS_AHEAD`] at a time, its
//! state stays on one core for that many batches; what crosses per batch is the plan,
//! copied once, in order, out of a vector claimed for writing before it was written.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::LoaderConfig;
use crate::batch::Sections;
use crate::dataset::{DatasetSizes, View};
use crate::device::staging::StagingBuffer;
use crate::error::Result;
use crate::prefetch::prefetch_for_writing;
use crate::sampler::{BatchPlan, EpochBatches, EventRef, PlanScratch, SamplerState};

/// Batches planned at a time, and the fewest ready before a thread that takes one plans
/// more (when no other thread is planning).
const PLANS_AHEAD: usize = 16;

/// The epoch's batch plans, numbered in order.
pub(crate) struct Plans<'a> {
    /// The sampler: locked by the thread that plans the next chunk.
    sampler: Mutex<Sampler<'a>>,
    /// Planned batches not yet taken.
    ready: Mutex<Ready>,
    /// The sampler has no batch left (set under its lock).
    exhausted: AtomicBool,
    pub(crate) view: &'a View,
    sizes: &'a DatasetSizes<'a>,
    /// Set once a plan or a gather failed: the epoch ends at that error.
    failed: AtomicBool,
}

/// A plan taken by a gathering thread ([`Plans::next_in`]).
pub(crate) struct NextPlan {
    /// Its number in the epoch: the order batches are delivered in.
    pub(crate) seq: u64,
    /// The plan, or the error that ends the epoch (a shard that failed to open).
    pub(crate) plan: Result<BatchPlan>,
    /// The section table to lay it out in: the one its staging buffer's last batch had.
    pub(crate) sections: Sections,
    /// Seconds the thread spent planning chunks of batches in the call that took it (zero
    /// unless it found fewer than [`PLANS_AHEAD`] ready and no other thread planning).
    pub(crate) planning_seconds: f64,
}

/// The epoch's sampler, the number of the next batch it plans, the scratch it puts a
/// batch in stored order with, and the vectors a chunk is planned in (all kept from one
/// chunk to the next, and on the planning thread's core for the whole chunk).
struct Sampler<'a> {
    batches: EpochBatches<'a>,
    next_seq: u64,
    scratch: PlanScratch,
    vectors: Vec<Vec<EventRef>>,
    chunk: Vec<(u64, BatchPlan)>,
}

/// Batches planned and not yet taken, oldest first, each with its number, and the vectors
/// of taken ones for the next chunk: the same vectors go round for the whole epoch, each
/// written on the planning thread and read on the taking one, never freed on another
/// thread than their own.
struct Ready {
    plans: VecDeque<(u64, BatchPlan)>,
    spare: Vec<Vec<EventRef>>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl<'a> Plans<'a> {
    /// The plans of `config`'s epoch from `position` on.
    pub(crate) fn new(
        view: &'a View,
        sizes: &'a DatasetSizes<'a>,
        config: &LoaderConfig,
        position: SamplerState,
    ) -> Plans<'a> {
        Plans {
            sampler: Mutex::new(Sampler {
                batches: EpochBatches::new(sizes, &config.sampler, position),
                next_seq: 0,
                scratch: PlanScratch::default(),
                vectors: Vec::with_capacity(PLANS_AHEAD),
                chunk: Vec::with_capacity(PLANS_AHEAD),
            }),
            ready: Mutex::new(Ready {
                plans: VecDeque::with_capacity(2 * PLANS_AHEAD),
                spare: Vec::with_capacity(2 * PLANS_AHEAD),
            }),
            exhausted: AtomicBool::new(false),
            view,
            sizes,
            failed: AtomicBool::new(false),
        }
    }

    /// The next plan and its number, copied into `events` (emptied first, its memory
    /// reused), and the seconds this call spent planning; `None` at the end of the epoch
    /// or after an error. Plans the next chunk first when none is ready, or after taking
    /// one when few are and no other thread is planning.
    fn next(&self, events: &mut Vec<EventRef>) -> Option<(u64, Result<BatchPlan>, f64)> {
        let mut planning_seconds = 0.0;
        let (seq, global_index) = loop {
            if self.failed.load(Ordering::Acquire) {
                return None;
            }
            // Read before looking for a ready plan: the last chunk is made ready before
            // the flag is set, so a flag set and no plan ready means none is left.
            let exhausted = self.exhausted.load(Ordering::Acquire);
            if let Some((taken, left)) = self.take_ready(events) {
                if left < PLANS_AHEAD && !exhausted {
                    if let Ok(sampler) = self.sampler.try_lock() {
                        planning_seconds += self.plan_chunk(sampler);
                    }
                }
                break taken;
            }
            if exhausted {
                return None;
            }
            let sampler = locked(&self.sampler);
            // Another thread may have planned while this one waited for the lock.
            if locked(&self.ready).plans.is_empty() {
                planning_seconds += self.plan_chunk(sampler);
            }
        };
        if let Some(e) = self.sizes.take_error() {
            self.fail();
            return Some((seq, Err(e), planning_seconds));
        }
        let mut plan = BatchPlan {
            global_index,
            events: std::mem::take(events),
        };
        // Numbered as the view numbers its events until here; read as the shards do.
        self.view.locate_plan(&mut plan);
        Some((seq, Ok(plan), planning_seconds))
    }

    /// The oldest ready plan's number and global index, its events copied into `events`,
    /// and how many plans are left ready; `None` when none is.
    fn take_ready(&self, events: &mut Vec<EventRef>) -> Option<((u64, u64), usize)> {
        let mut ready = locked(&self.ready);
        let (seq, planned) = ready.plans.pop_front()?;
        events.clear();
        events.extend_from_slice(&planned.events);
        ready.spare.push(planned.events);
        Some(((seq, planned.global_index), ready.plans.len()))
    }

    /// Plans up to [`PLANS_AHEAD`] batches with `sampler` (its lock held) in vectors of
    /// taken plans, and makes them ready; the seconds it took.
    fn plan_chunk(&self, mut sampler: MutexGuard<'_, Sampler<'a>>) -> f64 {
        if self.exhausted.load(Ordering::Acquire) {
            return 0.0;
        }
        let started = Instant::now();
        let Sampler {
            batches,
            next_seq,
            scratch,
            vectors,
            chunk,
        } = &mut *sampler;
        {
            let mut ready = locked(&self.ready);
            let keep = ready.spare.len().saturating_sub(PLANS_AHEAD);
            vectors.extend(ready.spare.drain(keep..));
        }
        let mut last = false;
        while chunk.len() < PLANS_AHEAD {
            let mut events = vectors.pop().unwrap_or_default();
            emptied_and_claimed(&mut events);
            let Some(plan) = batches.next_reusing(&mut events, scratch) else {
                vectors.push(events);
                last = true;
                break;
            };
            chunk.push((*next_seq, plan));
            *next_seq += 1;
        }
        let mut ready = locked(&self.ready);
        ready.plans.extend(chunk.drain(..));
        ready.spare.append(vectors);
        drop(ready);
        if last {
            // After the last plans are ready (see `Plans::next`).
            self.exhausted.store(true, Ordering::Release);
        }
        started.elapsed().as_secs_f64()
    }

    /// [`Plans::next`] in the vectors `buffer` kept from its last batch: the plan, and the
    /// section table to lay it out in. Without a next plan the vectors stay in the buffer.
    pub(crate) fn next_in(&self, buffer: &mut StagingBuffer) -> Option<NextPlan> {
        let mut vectors = buffer.take_vectors();
        match self.next(&mut vectors.events) {
            Some((seq, plan, planning_seconds)) => Some(NextPlan {
                seq,
                plan,
                sections: vectors.sections,
                planning_seconds,
            }),
            None => {
                buffer.keep_vectors(vectors);
                None
            }
        }
    }

    /// Ends the epoch for every thread (after an error).
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }
}

/// Empties a taken plan's vector and claims its memory for writing, all at once rather
/// than one store miss after another (its lines were last read on the thread that took
/// the plan, which may be another core); returns the bytes claimed. The vector comes back
/// holding the taken plan's events, so it is emptied first: the room past them, all the
/// claim covered before (3e3273e to 2026-11-28), is none (docs/results.md, "The plans'
/// vectors claimed again").
fn emptied_and_claimed(events: &mut Vec<EventRef>) -> usize {
    events.clear();
    prefetch_for_writing(events.spare_capacity_mut())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Barrier};

    use super::*;
    use crate::dataset::small_shards_fixture;
    use crate::sampler::{Batching, SamplerConfig};

    /// Every plan taken by `workers` threads that take plans until none is left and one
    /// that, like the waiting thread, takes one at a time and stops once the workers have
    /// stopped: the plans ready then would never be gathered. By number.
    fn taken_by_threads(plans: &Plans<'_>, workers: usize) -> Vec<(u64, BatchPlan)> {
        let start = Barrier::new(workers + 1);
        let stopped = AtomicUsize::new(0);
        let take_all = |until: &dyn Fn() -> bool| {
            let mut taken = Vec::new();
            start.wait();
            while !until() {
                let Some((seq, plan, _)) = plans.next(&mut Vec::new()) else {
                    assert!(plans.next(&mut Vec::new()).is_none());
                    break;
                };
                taken.push((seq, plan.expect("no shard fails")));
            }
            taken
        };
        let mut taken: Vec<(u64, BatchPlan)> = std::thread::scope(|scope| {
            let mut handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let taken = take_all(&|| false);
                        stopped.fetch_add(1, Ordering::AcqRel);
                        taken
                    })
                })
                .collect();
            handles.push(scope.spawn(|| take_all(&|| stopped.load(Ordering::Acquire) == workers)));
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        taken.sort_by_key(|(seq, _)| *seq);
        taken
    }

    #[test]
    fn threads_take_every_plan_once_numbered_in_the_samplers_order() {
        let dir = tempfile::tempdir().unwrap();
        let view = View::from(Arc::new(small_shards_fixture(dir.path())));
        let sizes = DatasetSizes::new(&view);
        let small = SamplerConfig {
            block_events: 4,
            window_blocks: 4,
            batching: Batching::Events(3),
            ..SamplerConfig::default()
        };
        let cases = [
            (small.clone(), SamplerState::start(0)),
            (small.clone(), SamplerState::at(1, 7)),
            (
                SamplerConfig {
                    batching: Batching::Events(2),
                    drop_last: true,
                    world: 2,
                    rank: 1,
                    ..small.clone()
                },
                SamplerState::start(2),
            ),
            (
                SamplerConfig {
                    batching: Batching::Pulses {
                        max_pulses: 300,
                        max_events: Some(5),
                        pulse_cap: None,
                    },
                    ..small
                },
                SamplerState::start(3),
            ),
        ];
        for (sampler, position) in cases {
            let expected: Vec<BatchPlan> = EpochBatches::new(&sizes, &sampler, position)
                .map(|mut plan| {
                    view.locate_plan(&mut plan);
                    plan
                })
                .collect();
            assert!(
                expected.len() > 2 * PLANS_AHEAD,
                "several chunks: {} plans",
                expected.len()
            );
            let config = LoaderConfig {
                sampler: sampler.clone(),
                ..LoaderConfig::default()
            };
            // Many tries with 2 workers, to meet the races at the epoch's end.
            for workers in [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2] {
                let plans = Plans::new(&view, &sizes, &config, position);
                let taken = taken_by_threads(&plans, workers);
                assert_eq!(
                    taken.len(),
                    expected.len(),
                    "{sampler:?}, {workers} workers"
                );
                for (i, ((seq, plan), expected)) in taken.iter().zip(&expected).enumerate() {
                    assert_eq!(*seq, i as u64, "numbered in order, each once");
                    assert_eq!(plan, expected, "plan {i}, {sampler:?}, {workers} workers");
                }
            }
        }
    }

    #[test]
    fn a_taken_plans_vector_is_claimed_whole_for_the_next_plan() {
        // As a taken plan's vector comes back: full, with no room past its events.
        let event = EventRef { shard: 1, index: 2 };
        let mut events = vec![event; 256];
        events.shrink_to_fit();
        let capacity = events.capacity();
        let claimed = emptied_and_claimed(&mut events);
        assert!(events.is_empty());
        assert_eq!(events.capacity(), capacity, "its memory kept");
        let whole = std::mem::size_of_val(events.spare_capacity_mut());
        assert_eq!(
            prefetch_for_writing::<u8>(&[]),
            0,
            "an empty region claims nothing"
        );
        let line = [std::mem::MaybeUninit::<u8>::uninit(); 64];
        if prefetch_for_writing(&line) == 64 {
            assert_eq!(claimed, whole, "the whole vector claimed (2 KiB)");
        } else {
            eprintln!("no prefetchw on this CPU: nothing is claimed");
            assert_eq!(claimed, 0);
        }
    }

    #[test]
    fn a_failed_epoch_hands_out_no_plan_though_some_are_ready() {
        let dir = tempfile::tempdir().unwrap();
        let view = View::from(Arc::new(small_shards_fixture(dir.path())));
        let sizes = DatasetSizes::new(&view);
        let plans = Plans::new(
            &view,
            &sizes,
            &LoaderConfig::default(),
            SamplerState::start(0),
        );
        let (seq, plan, planning_seconds) = plans.next(&mut Vec::new()).unwrap();
        assert!(
            planning_seconds > 0.0,
            "the first call planned the first chunk"
        );
        assert_eq!(seq, 0);
        assert!(plan.is_ok());
        assert!(
            !locked(&plans.ready).plans.is_empty(),
            "a chunk was planned"
        );
        plans.fail();
        assert!(plans.next(&mut Vec::new()).is_none());
    }
}
