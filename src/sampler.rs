//! The block-shuffle sampler: which events each batch holds, for every rank, every epoch.
//!
//! The dataset is cut into **blocks**: runs of `block_events` consecutive events inside one
//! shard (the last block of a shard may be shorter), read sequentially. For epoch `e`:
//! 1. the blocks are permuted with a generator seeded by `(seed, e)`;
//! 2. the permuted blocks are taken `window_blocks` at a time; the events of a window, in
//!    runs of `run_events` consecutive events of a block, are shuffled run by run (seeded by
//!    `(seed, e, window)`) and emitted (runs turn many small copies into few large ones);
//! 3. the resulting global event sequence is cut into batches: `Events(n)` takes `n`
//!    events at a time; `Pulses { max_pulses, max_events }` adds events while the batch stays
//!    within the pulse budget (an event larger than the budget forms a batch of its own);
//! 4. global batch `k` goes to rank `k % world`.
//!
//! The global sequence depends only on the dataset, seed, epoch, block size, window and
//! batching, never on the world size or thread counts. Without `drop_last` every event is
//! delivered exactly once per epoch across ranks (ranks' batch counts differ by at most
//! one). With `drop_last` the final batch is dropped when it is incomplete (fewer than `n`
//! events; in pulse mode, closed by the end of the epoch rather than by the budget), then
//! trailing batches are dropped until every rank has the same number: at most `world`
//! batches' worth of events are skipped, and they differ from epoch to epoch.
//!
//! Shards are pre-shuffled, so a block is itself a random sample: small windows cost little
//! randomness (see the shuffle-quality report of the bench).

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// How events are grouped into batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Batching {
    /// A fixed number of events per batch.
    Events(usize),
    /// As many events as fit in a pulse budget (bounded memory on heavy tails), and at
    /// most `max_events` when given.
    Pulses {
        /// Pulses per batch at most (unless one event alone is larger).
        max_pulses: usize,
        /// Events per batch at most.
        max_events: Option<usize>,
    },
}

/// Everything that decides the order and partition of batches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerConfig {
    /// Shuffle seed.
    pub seed: u64,
    /// Events per block (sequential reads).
    pub block_events: usize,
    /// Blocks open at once; events are shuffled within a window.
    pub window_blocks: usize,
    /// Consecutive events drawn together (1: every event drawn on its own).
    pub run_events: usize,
    /// Batching rule.
    pub batching: Batching,
    /// Drop incomplete trailing batches (see the module docs).
    pub drop_last: bool,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            seed: 0,
            block_events: 256,
            window_blocks: 16,
            run_events: 1,
            batching: Batching::Events(256),
            drop_last: false,
            rank: 0,
            world: 1,
        }
    }
}

impl SamplerConfig {
    /// Rejects configurations that cannot work, with a message naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.block_events == 0 || self.window_blocks == 0 || self.run_events == 0 {
            return Err("block size, window and run length must be at least 1".into());
        }
        if self.world == 0 || self.rank >= self.world {
            return Err(format!(
                "rank {} must be below world size {}",
                self.rank, self.world
            ));
        }
        match self.batching {
            Batching::Events(0) => Err("batch size must be at least 1 event".into()),
            Batching::Pulses { max_pulses: 0, .. }
            | Batching::Pulses {
                max_events: Some(0),
                ..
            } => Err("pulse budget and event cap must be at least 1".into()),
            _ => Ok(()),
        }
    }
}

/// Where an event is: shard and index inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EventRef {
    /// Shard index (manifest order).
    pub shard: u32,
    /// Event index inside the shard.
    pub index: u32,
}

/// The sizes the sampler needs to know: events per shard, pulses per event.
pub trait EventSizes {
    /// Events in each shard, in manifest order.
    fn shard_events(&self) -> Vec<usize>;
    /// Pulses of one event (asked only when batching by a pulse budget).
    fn pulses(&self, event: EventRef) -> usize;
}

/// One batch: its global number in the epoch and its events in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPlan {
    /// The global batch number within the epoch (`% world` is its rank).
    pub global_index: u64,
    /// Events in delivery order.
    pub events: Vec<EventRef>,
}

/// Where a rank stands: the small value a training job saves in its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Current epoch.
    pub epoch: u64,
    /// Batches this rank has taken in that epoch.
    pub batches_taken: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    shard: u32,
    start: u32,
    len: u32,
}

const STREAM_BLOCKS: u64 = 0x0b10_c4b1;
const STREAM_WINDOW: u64 = 0x3a7d_0e11;

/// The global event sequence of one epoch, produced window by window (memory bounded by a
/// window, whatever the epoch length).
struct EventStream {
    blocks: Vec<Block>,
    window_blocks: usize,
    run_events: u32,
    seed: u64,
    epoch: u64,
    next_window: usize,
    buffered: std::vec::IntoIter<EventRef>,
}

impl EventStream {
    fn new(shard_events: &[usize], config: &SamplerConfig, epoch: u64) -> EventStream {
        let mut blocks = Vec::new();
        for (shard, &n) in shard_events.iter().enumerate() {
            let mut start = 0;
            while start < n {
                let len = config.block_events.min(n - start);
                blocks.push(Block {
                    shard: shard as u32,
                    start: start as u32,
                    len: len as u32,
                });
                start += len;
            }
        }
        Rng::stream(config.seed ^ STREAM_BLOCKS, epoch).shuffle(&mut blocks);
        EventStream {
            blocks,
            window_blocks: config.window_blocks,
            run_events: config.run_events.min(u32::MAX as usize) as u32,
            seed: config.seed,
            epoch,
            next_window: 0,
            buffered: Vec::new().into_iter(),
        }
    }
}

impl Iterator for EventStream {
    type Item = EventRef;

    fn next(&mut self) -> Option<EventRef> {
        loop {
            if let Some(e) = self.buffered.next() {
                return Some(e);
            }
            let first = self.next_window * self.window_blocks;
            if first >= self.blocks.len() {
                return None;
            }
            let window = &self.blocks[first..(first + self.window_blocks).min(self.blocks.len())];
            let run = self.run_events;
            let mut runs: Vec<(u32, u32, u32)> = window
                .iter()
                .flat_map(|b| {
                    (b.start..b.start + b.len)
                        .step_by(run as usize)
                        .map(move |start| (b.shard, start, (b.start + b.len).min(start + run)))
                })
                .collect();
            let stream = (self.epoch << 32) ^ self.next_window as u64;
            Rng::stream(self.seed ^ STREAM_WINDOW, stream).shuffle(&mut runs);
            let events: Vec<EventRef> = runs
                .into_iter()
                .flat_map(|(shard, start, end)| {
                    (start..end).map(move |index| EventRef { shard, index })
                })
                .collect();
            self.buffered = events.into_iter();
            self.next_window += 1;
        }
    }
}

/// All batches of one epoch, in global order (every rank's).
struct GlobalBatches<'a> {
    events: std::iter::Peekable<EventStream>,
    sizes: &'a dyn EventSizes,
    batching: Batching,
    next_index: u64,
}

impl GlobalBatches<'_> {
    /// The next batch, and whether it is complete (see `drop_last`).
    fn next_batch(&mut self) -> Option<(BatchPlan, bool)> {
        let mut plan = BatchPlan {
            global_index: self.next_index,
            events: Vec::new(),
        };
        let mut batch_pulses = 0;
        let complete = loop {
            let Some(&event) = self.events.peek() else {
                break false;
            };
            match self.batching {
                Batching::Events(n) => {
                    plan.events.push(event);
                    self.events.next();
                    if plan.events.len() == n {
                        break true;
                    }
                }
                Batching::Pulses {
                    max_pulses,
                    max_events,
                } => {
                    let pulses = self.sizes.pulses(event);
                    if !plan.events.is_empty() && batch_pulses + pulses > max_pulses {
                        break true;
                    }
                    plan.events.push(event);
                    batch_pulses += pulses;
                    self.events.next();
                    if max_events.is_some_and(|m| plan.events.len() == m) {
                        break true;
                    }
                }
            }
        };
        if plan.events.is_empty() {
            return None;
        }
        self.next_index += 1;
        Some((plan, complete))
    }
}

/// The batches of one epoch for one rank.
pub struct EpochBatches<'a> {
    global: GlobalBatches<'a>,
    config: SamplerConfig,
    /// Global batches to deliver (across ranks) when `drop_last` trims the epoch.
    limit: Option<u64>,
    taken: u64,
}

impl<'a> EpochBatches<'a> {
    /// The batches of `config.rank` in `epoch`, after skipping the first `skip` of them.
    pub fn new(
        sizes: &'a dyn EventSizes,
        config: &SamplerConfig,
        epoch: u64,
        skip: u64,
    ) -> EpochBatches<'a> {
        let shard_events = sizes.shard_events();
        let make = || GlobalBatches {
            events: EventStream::new(&shard_events, config, epoch).peekable(),
            sizes,
            batching: config.batching,
            next_index: 0,
        };
        let limit = config.drop_last.then(|| {
            // One pass over the epoch's order (indexes only, no data) to count its batches.
            let mut counting = make();
            let (mut total, mut last_complete) = (0u64, true);
            while let Some((_, complete)) = counting.next_batch() {
                total += 1;
                last_complete = complete;
            }
            let usable = if last_complete { total } else { total - 1 };
            usable - usable % config.world as u64
        });
        let mut batches = EpochBatches {
            global: make(),
            config: config.clone(),
            limit,
            taken: 0,
        };
        for _ in 0..skip {
            if batches.next().is_none() {
                break;
            }
        }
        batches
    }
}

impl Iterator for EpochBatches<'_> {
    type Item = BatchPlan;

    fn next(&mut self) -> Option<BatchPlan> {
        loop {
            let (plan, _) = self.global.next_batch()?;
            if self.limit.is_some_and(|l| plan.global_index >= l) {
                return None;
            }
            if plan.global_index % self.config.world as u64 == self.config.rank as u64 {
                self.taken += 1;
                return Some(plan);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    struct Sizes(Vec<usize>);

    impl EventSizes for Sizes {
        fn shard_events(&self) -> Vec<usize> {
            self.0.clone()
        }
        fn pulses(&self, e: EventRef) -> usize {
            1 + ((e.shard as usize * 7919 + e.index as usize * 104_729) % 97)
        }
    }

    fn all(sizes: &Sizes, config: &SamplerConfig, epoch: u64) -> Vec<BatchPlan> {
        EpochBatches::new(sizes, config, epoch, 0).collect()
    }

    fn batching() -> impl Strategy<Value = Batching> {
        prop_oneof![
            (1usize..40).prop_map(Batching::Events),
            (1usize..400, proptest::option::of(1usize..30)).prop_map(|(max_pulses, max_events)| {
                Batching::Pulses {
                    max_pulses,
                    max_events,
                }
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn every_event_once_per_epoch_across_ranks(
            shards in proptest::collection::vec(0usize..300, 1..6),
            seed in any::<u64>(), epoch in 0u64..5, block in 1usize..64, window in 1usize..8,
            batching in batching(), world in 1usize..9, run in 1usize..12,
        ) {
            let sizes = Sizes(shards.clone());
            let total: usize = shards.iter().sum();
            let base = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, drop_last: false, rank: 0, world: 1 };
            let reference: Vec<BatchPlan> = all(&sizes, &base, epoch);
            let mut union = Vec::new();
            for rank in 0..world {
                let config = SamplerConfig { rank, world, ..base.clone() };
                union.extend(all(&sizes, &config, epoch));
            }
            union.sort_by_key(|b| b.global_index);
            prop_assert_eq!(&union, &reference, "the union of ranks is the world-1 sequence");
            let events: Vec<EventRef> = reference.iter().flat_map(|b| b.events.clone()).collect();
            prop_assert_eq!(events.len(), total);
            prop_assert_eq!(events.iter().collect::<BTreeSet<_>>().len(), total, "no event twice");
            for b in &reference {
                let pulses: usize = b.events.iter().map(|&e| sizes.pulses(e)).sum();
                match batching {
                    Batching::Events(n) => prop_assert!(b.events.len() <= n),
                    Batching::Pulses { max_pulses, max_events } => {
                        prop_assert!(pulses <= max_pulses || b.events.len() == 1);
                        prop_assert!(max_events.is_none_or(|m| b.events.len() <= m));
                    }
                }
            }
        }

        #[test]
        fn drop_last_gives_equal_counts_and_loses_little(
            shards in proptest::collection::vec(0usize..300, 1..6),
            seed in any::<u64>(), block in 1usize..64, window in 1usize..8,
            batching in batching(), world in 1usize..9, run in 1usize..12,
        ) {
            let sizes = Sizes(shards.clone());
            let base = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, drop_last: true, rank: 0, world };
            let per_rank: Vec<Vec<BatchPlan>> = (0..world).map(|rank| all(&sizes, &SamplerConfig { rank, ..base.clone() }, 1)).collect();
            let counts: BTreeSet<usize> = per_rank.iter().map(|r| r.len()).collect();
            prop_assert!(counts.len() <= 1, "every rank the same number of batches: {:?}", counts);
            let kept: BTreeSet<EventRef> = per_rank.iter().flatten().flat_map(|b| b.events.clone()).collect();
            let full = all(&sizes, &SamplerConfig { drop_last: false, world: 1, ..base.clone() }, 1);
            prop_assert!(full.len() - per_rank.iter().map(|r| r.len()).sum::<usize>() <= world, "at most `world` batches dropped");
            if let Batching::Events(n) = batching {
                prop_assert!(per_rank.iter().flatten().all(|b| b.events.len() == n));
            }
            prop_assert_eq!(kept.len(), per_rank.iter().flatten().map(|b| b.events.len()).sum::<usize>());
        }

        #[test]
        fn resume_yields_exactly_the_rest(
            shards in proptest::collection::vec(1usize..200, 1..4), seed in any::<u64>(),
            batching in batching(), world in 1usize..4, rank_pick in 0usize..4, skip in 0u64..30, drop_last: bool,
            run in 1usize..12,
        ) {
            let sizes = Sizes(shards);
            let config = SamplerConfig { seed, block_events: 16, window_blocks: 3, run_events: run, batching, drop_last, rank: rank_pick % world, world };
            let whole = all(&sizes, &config, 2);
            let rest: Vec<BatchPlan> = EpochBatches::new(&sizes, &config, 2, skip).collect();
            prop_assert_eq!(&rest[..], &whole[(skip as usize).min(whole.len())..]);
        }
    }

    #[test]
    fn runs_are_consecutive_events_of_one_block() {
        let sizes = Sizes(vec![100, 37]);
        let config = SamplerConfig {
            block_events: 20,
            window_blocks: 3,
            run_events: 8,
            batching: Batching::Events(1000),
            ..SamplerConfig::default()
        };
        let events: Vec<EventRef> = all(&sizes, &config, 0)
            .into_iter()
            .flat_map(|b| b.events)
            .collect();
        let mut i = 0;
        while i < events.len() {
            let e = events[i];
            // A run starts at a multiple of 8 inside its block and ends at 8 events or the block's end.
            assert_eq!((e.index % 20) % 8, 0, "{e:?}");
            let block_end = ((e.index / 20 + 1) * 20).min(sizes.0[e.shard as usize] as u32);
            let len = 8.min(block_end - e.index) as usize;
            for k in 0..len {
                assert_eq!(
                    events[i + k],
                    EventRef {
                        shard: e.shard,
                        index: e.index + k as u32
                    }
                );
            }
            i += len;
        }
    }

    #[test]
    fn epochs_differ_and_blocks_stay_sequential() {
        let sizes = Sizes(vec![1000, 1000]);
        let config = SamplerConfig {
            block_events: 50,
            window_blocks: 1,
            batching: Batching::Events(50),
            ..SamplerConfig::default()
        };
        let e0 = all(&sizes, &config, 0);
        let e1 = all(&sizes, &config, 1);
        assert_ne!(e0, e1);
        for b in &e0 {
            // Window of one block: each batch is one whole block, from one shard, in some order.
            let mut idx: Vec<u32> = b.events.iter().map(|e| e.index).collect();
            idx.sort();
            assert!(b.events.iter().all(|e| e.shard == b.events[0].shard));
            assert_eq!(idx.last().unwrap() - idx[0], 49);
            assert_eq!(idx[0] % 50, 0);
        }
    }
}
