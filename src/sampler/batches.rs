//! An epoch's event sequence cut into batches, counted, and dealt to the ranks.

use super::stream::{EventStream, PlanScratch};
use super::{BatchOrder, BatchPlan, Batching, EventRef, EventSizes, SamplerConfig, SamplerState};

/// All batches of one epoch, in global order (every rank's).
struct GlobalBatches<'a> {
    events: EventStream,
    sizes: &'a dyn EventSizes,
    batching: Batching,
    order: BatchOrder,
    next_index: u64,
    /// Whether the windows' events are announced ahead (not for a counting pass, nor at
    /// window 1).
    read_ahead: bool,
}

impl<'a> GlobalBatches<'a> {
    /// The batches of `epoch`, planned for a loader (its windows announced ahead when
    /// `read_ahead`).
    fn new(
        sizes: &'a dyn EventSizes,
        config: &SamplerConfig,
        epoch: u64,
        read_ahead: bool,
    ) -> GlobalBatches<'a> {
        GlobalBatches {
            events: EventStream::new(&sizes.shard_events(), config, epoch),
            sizes,
            batching: config.batching,
            order: config.batch_order,
            next_index: 0,
            read_ahead,
        }
    }

    /// The batches of `epoch`, only to be counted: the same batches, cut where a loader's
    /// are, but none of their events listed or put in order: 20-22 ns an event at window
    /// 16 under a pulse budget, where planning them takes 26-29 (`cargo bench --bench
    /// plan`). Under a token budget no window's order is drawn either
    /// ([`EventStream::only_counted`]).
    fn counting(sizes: &'a dyn EventSizes, config: &SamplerConfig, epoch: u64) -> Self {
        let batches = GlobalBatches::new(sizes, config, epoch, false);
        GlobalBatches {
            events: batches.events.only_counted(),
            ..batches
        }
    }

    /// The next batch, and whether it is complete (see `drop_last`): its events are
    /// planned in `events` (emptied first, its memory reused) and taken out of it; without
    /// a next batch, `events` keeps its memory. In a counting pass the batch's events are
    /// left unlisted (see [`GlobalBatches::counting`]).
    fn next_batch(
        &mut self,
        events: &mut Vec<EventRef>,
        scratch: &mut PlanScratch,
    ) -> Option<(BatchPlan, bool)> {
        let capacity = self.batching.max_events().unwrap_or(0);
        events.clear();
        events.reserve(capacity.min(1 << 16));
        let mut plan = BatchPlan {
            global_index: self.next_index,
            events: std::mem::take(events),
        };
        let (mut held, mut batch_pulses, mut pieces) = (0, 0, 0);
        let counting = self.events.counted();
        // Taken window by window: each window's piece is put in order on its own.
        let complete = loop {
            if self.read_ahead {
                self.events.announce(self.sizes);
            }
            let Some(window) = self.events.window(self.sizes) else {
                break false;
            };
            let (n, full) = match self.batching {
                Batching::Events(n) => {
                    let k = (n - held).min(window.remaining());
                    (k, held + k == n)
                }
                Batching::Pulses {
                    max_pulses,
                    max_events,
                    pulse_cap,
                } => {
                    let (mut k, mut full) = (0, false);
                    let cap = pulse_cap.unwrap_or(usize::MAX);
                    while k < window.remaining() {
                        let pulses = window.pulses_ahead(k, self.sizes).min(cap);
                        let held = held + k;
                        if held > 0 && batch_pulses + pulses > max_pulses {
                            full = true;
                            break;
                        }
                        batch_pulses += pulses;
                        k += 1;
                        if max_events.is_some_and(|m| held + 1 == m) {
                            full = true;
                            break;
                        }
                    }
                    (k, full)
                }
                // The window was cut into batches when it opened: a batch never spans two.
                Batching::Tokens { .. } => (window.until_batch_end(), true),
            };
            if counting {
                window.skip(n);
            } else {
                window.take(n, self.order, &mut plan.events, scratch);
            }
            held += n;
            pieces += 1;
            if full {
                break true;
            }
        };
        if held == 0 {
            *events = plan.events;
            return None;
        }
        if self.order == BatchOrder::Stored && pieces > 1 {
            plan.events.sort_unstable();
        }
        self.next_index += 1;
        Some((plan, complete))
    }
}

/// Global batches of `epoch` (all events, every rank) and whether the last is complete.
fn global_batch_count(sizes: &dyn EventSizes, config: &SamplerConfig, epoch: u64) -> (u64, bool) {
    let total_events: u64 = sizes.shard_events().iter().map(|&n| n as u64).sum();
    if let Batching::Events(n) = config.batching {
        // Fixed-size batches cut the epoch's event sequence: no pass needed.
        let n = n as u64;
        return (total_events.div_ceil(n), total_events.is_multiple_of(n));
    }
    // One pass over the epoch's order (indexes only, no data) to count its batches.
    let mut counting = GlobalBatches::counting(sizes, config, epoch);
    let (mut total, mut last_complete) = (0u64, true);
    let (mut events, mut scratch) = (Vec::new(), PlanScratch::default());
    while let Some((plan, complete)) = counting.next_batch(&mut events, &mut scratch) {
        total += 1;
        last_complete = complete;
        events = plan.events;
    }
    (total, last_complete)
}

/// The end of the global batches delivered in `epoch` to ranks dealing them from global
/// batch `origin` on: all of them, or with `drop_last` the complete ones, trimmed so that
/// every rank gets as many (a multiple of the world size past `origin`).
pub(super) fn delivered_global_batches(
    sizes: &dyn EventSizes,
    config: &SamplerConfig,
    epoch: u64,
    origin: u64,
) -> u64 {
    let (total, last_complete) = global_batch_count(sizes, config, epoch);
    if !config.drop_last {
        return total;
    }
    let usable = if last_complete { total } else { total - 1 };
    let dealt = usable.saturating_sub(origin);
    origin + dealt - dealt % config.world as u64
}

/// The exact number of batches `config.rank` gets in `epoch` when the ranks deal the
/// global batches from `origin` on (0 for a whole epoch; see [`SamplerState`]): what
/// [`EpochBatches::new`] yields for a position with that origin and no batch taken. With
/// [`Batching::Events`] this is arithmetic; with a pulse budget it is one pass over the
/// epoch's order (sizes only).
pub fn rank_batch_count(
    sizes: &dyn EventSizes,
    config: &SamplerConfig,
    epoch: u64,
    origin: u64,
) -> u64 {
    let dealt = delivered_global_batches(sizes, config, epoch, origin).saturating_sub(origin);
    let (world, rank) = (config.world as u64, config.rank as u64);
    dealt / world + u64::from(rank < dealt % world)
}

/// The batches of one epoch for one rank.
pub struct EpochBatches<'a> {
    global: GlobalBatches<'a>,
    config: SamplerConfig,
    /// The first global batch dealt to the ranks (see [`SamplerState::origin`]).
    origin: u64,
    /// With `drop_last`, the vector the other ranks' batches of a step are planned in
    /// while this rank's waits to learn whether its step is whole (see `next_reusing`).
    step_rest: Vec<EventRef>,
    /// The scratch of the batches planned through [`Iterator::next`].
    scratch: PlanScratch,
}

impl<'a> EpochBatches<'a> {
    /// The batches of `config.rank` at `position`: those of `position.epoch` dealt from
    /// global batch `position.origin` on, after the first `position.batches_taken`.
    pub fn new(
        sizes: &'a dyn EventSizes,
        config: &SamplerConfig,
        position: SamplerState,
    ) -> EpochBatches<'a> {
        // At window 1 the reads sweep one block at a time, which the kernel's own read-ahead
        // follows: announcing the next block there measured 15% slower cold epochs, while at
        // window 16 it measured 12% faster (0.58-0.67 -> 0.70-0.77 of the disk's rate).
        let read_ahead = config.window_blocks > 1;
        let mut batches = EpochBatches {
            global: GlobalBatches::new(sizes, config, position.epoch, read_ahead),
            config: config.clone(),
            origin: position.origin,
            step_rest: Vec::new(),
            scratch: PlanScratch::default(),
        };
        for _ in 0..position.batches_taken {
            if batches.next().is_none() {
                break;
            }
        }
        batches
    }

    /// The next batch, planned in `events` (emptied first) and taken out of it, and put in
    /// order in the calling thread's `scratch`: a loader that hands back the vector of a
    /// batch its consumer dropped plans without allocating, so no thread frees what
    /// another allocated, and no scratch passes between its threads. Without a next
    /// batch, `events` keeps its memory for the next epoch.
    pub fn next_reusing(
        &mut self,
        events: &mut Vec<EventRef>,
        scratch: &mut PlanScratch,
    ) -> Option<BatchPlan> {
        let (world, rank) = (self.config.world as u64, self.config.rank as u64);
        loop {
            let (plan, complete) = self.global.next_batch(events, scratch)?;
            let k = plan.global_index;
            if k < self.origin || (k - self.origin) % world != rank {
                *events = plan.events; // another rank's batch
                continue;
            }
            if !self.config.drop_last || self.step_is_whole(complete, world - 1 - rank, scratch) {
                return Some(plan);
            }
            // The epoch ended inside this step: no rank delivers any of it.
            *events = plan.events;
            return None;
        }
    }

    /// With `drop_last`: whether the step of a batch just planned (complete or not) is
    /// whole, the `after` global batches that follow it in the step (the other ranks')
    /// planned here, so that every rank delivers the step or none does. A step is whole
    /// when its last batch exists and is complete (only the epoch's last batch may not be),
    /// which is what [`delivered_global_batches`] counts in a pass over the whole epoch;
    /// looking one step ahead instead costs no pass at the epoch's start.
    fn step_is_whole(&mut self, complete: bool, after: u64, scratch: &mut PlanScratch) -> bool {
        let mut last_complete = complete;
        for _ in 0..after {
            match self.global.next_batch(&mut self.step_rest, scratch) {
                Some((plan, complete)) => {
                    last_complete = complete;
                    self.step_rest = plan.events;
                }
                None => return false,
            }
        }
        last_complete
    }
}

impl Iterator for EpochBatches<'_> {
    type Item = BatchPlan;

    fn next(&mut self) -> Option<BatchPlan> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let plan = self.next_reusing(&mut Vec::new(), &mut scratch);
        self.scratch = scratch;
        plan
    }
}
