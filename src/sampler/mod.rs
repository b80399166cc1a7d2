//! The block-shuffle sampler: which events each batch holds, for every rank, every epoch.
//!
//! For epoch `e`:
//! 1. the dataset's stored order (its shards concatenated in manifest order) is rotated by
//!    an offset drawn from `(seed, e)` and cut into **blocks** of `block_events`
//!    consecutive events, read sequentially (a block that crosses from one shard into the
//!    next, or wraps from the last shard to the first, is read as two sequential pieces);
//! 2. the blocks are permuted with a generator seeded by `(seed, e)`, except the one short
//!    block (when `block_events` does not divide the dataset), which comes last: it would
//!    otherwise shift every later batch off the block boundaries. Thanks to the rotation
//!    it holds different events every epoch;
//! 3. the permuted blocks are taken `window_blocks` at a time; the events of a window, in
//!    runs of `run_events` consecutive events of a block, are shuffled run by run (seeded by
//!    `(seed, e, window)`) and emitted (runs turn many small copies into few large ones);
//!    With [`LengthGrouping`] on (batches of `n` events only), the window's events that
//!    fill whole batches inside it (as step 4 cuts them) are then sorted by pulse or DOM
//!    count (capped; ties in drawn order) and cut into those batches, which are put in an order
//!    drawn from `(seed, e, window)`: each batch holds events of similar length, as the
//!    Kaggle competition's top transformers were fed (less padding; see
//!    [`LengthGrouping`]). The events before the window's first whole batch and after its
//!    last stay as drawn. With a token budget (`Tokens`) all of the window's events are
//!    sorted so and cut on their own, from the longest down: each batch as many events as
//!    its padded grid (events times its longest capped length) allows within `max_tokens`,
//!    a last batch of less than half the one before sharing that one's events; the
//!    window's batches are put in an order drawn from `(seed, e, window)`;
//! 4. the resulting global event sequence is cut into batches: `Events(n)` takes `n`
//!    events at a time; `Pulses { max_pulses, max_events }` adds events while the batch stays
//!    within the pulse budget (an event larger than the budget forms a batch of its own);
//!    `Tokens` takes the batches step 3 cut; with [`BatchOrder::Stored`] (the default) a
//!    batch's events are then put in stored order, which changes no batch's content;
//! 5. global batch `k` goes to rank `k % world`.
//!
//! The global sequence depends only on the dataset, seed, epoch, block size, window,
//! batching and batch order, never on the world size or thread counts. Without `drop_last`
//! every event is delivered exactly once per epoch across ranks (ranks' batch counts differ
//! by at most one). With `drop_last` the final batch is dropped when it is incomplete
//! (fewer than `n` events; in pulse mode, closed by the end of the epoch rather than by the
//! budget; never with a token budget, whose windows are cut on their own), then trailing
//! batches are dropped until every rank has the same number: at
//! most `world` batches' worth of events are skipped, and they differ from epoch to epoch.
//!
//! When the block size is a multiple of the batch size, no batch but the last straddles
//! two windows: at window 1 with blocks the size of a batch, a batch is one whole block, so
//! in stored order it is one contiguous run of each shard column (two where the block
//! crosses a shard boundary).
//!
//! Shards are pre-shuffled, so a block is itself a random sample: small windows cost little
//! randomness (see the shuffle-quality report of the bench).

mod batches;
mod regroup;
mod stored_order;
mod stream;
#[cfg(test)]
mod tests;
mod window_events;

pub use batches::{rank_batch_count, EpochBatches};
pub use stream::PlanScratch;

use serde::{Deserialize, Serialize};

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
        /// Each event counts at most this many of its pulses toward `max_pulses`: the
        /// pulses a model that cuts events to `pulse_cap` keeps (a GNN's nodes), so the
        /// budget bounds what it computes on, and an event of thousands of pulses does not
        /// fill a batch alone. None: all of them.
        #[serde(default)]
        pulse_cap: Option<usize>,
    },
    /// Batches of events grouped by length ([`LengthGrouping`]) whose padded grid (events
    /// times the batch's longest length, capped as the grouping caps it) holds at most
    /// `max_tokens` tokens (pulses, or DOMs when grouped by DOM count), as fairseq's
    /// `max_tokens` and ESPnet's `batch_bins` bound a batch: a model that pads each batch to
    /// its longest event gets grids of nearly equal size, short events in big batches and
    /// long ones in small. Each window's events are sorted by length and cut on their own
    /// (no batch spans two windows), then its batches are put in a random order.
    Tokens {
        /// Events times the batch's longest (capped) length, at most (unless one event
        /// alone is longer).
        max_tokens: usize,
        /// Events per batch at most.
        max_events: Option<usize>,
        /// The longest length counted rounded up to a multiple of this (at most the
        /// grouping's cap), as a model that pads each batch to such a multiple (tensor
        /// cores, fewer shapes to compile) pads it, so its grids stay within `max_tokens`.
        /// None: as it is.
        #[serde(default)]
        pad_to_multiple_of: Option<usize>,
    },
}

/// As the loader's arguments name it: `batch_events 256`, `max_pulses 4096`,
/// `max_pulses 4096, max_events 64, pulse_cap 256` or `max_tokens 65536, max_events 1024,
/// pad_to_multiple_of 16`.
impl std::fmt::Display for Batching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Batching::Events(events) => write!(f, "batch_events {events}"),
            Batching::Pulses {
                max_pulses: budget,
                max_events,
                pulse_cap,
            } => {
                Batching::write_budget(f, "max_pulses", *budget, *max_events)?;
                Batching::write_optional(f, "pulse_cap", *pulse_cap)
            }
            Batching::Tokens {
                max_tokens: budget,
                max_events,
                pad_to_multiple_of,
            } => {
                Batching::write_budget(f, "max_tokens", *budget, *max_events)?;
                Batching::write_optional(f, "pad_to_multiple_of", *pad_to_multiple_of)
            }
        }
    }
}

impl Batching {
    /// `name budget`, and `, max_events m` when capped.
    fn write_budget(
        f: &mut std::fmt::Formatter<'_>,
        name: &str,
        budget: usize,
        max_events: Option<usize>,
    ) -> std::fmt::Result {
        write!(f, "{name} {budget}")?;
        Batching::write_optional(f, "max_events", max_events)
    }

    /// `, name value` when given.
    fn write_optional(
        f: &mut std::fmt::Formatter<'_>,
        name: &str,
        value: Option<usize>,
    ) -> std::fmt::Result {
        match value {
            Some(value) => write!(f, ", {name} {value}"),
            None => Ok(()),
        }
    }

    /// The events a batch holds at most, when bounded.
    pub fn max_events(self) -> Option<usize> {
        match self {
            Batching::Events(n) => Some(n),
            Batching::Pulses { max_events, .. } | Batching::Tokens { max_events, .. } => max_events,
        }
    }
}

/// The order of the events inside a batch (which events a batch holds does not depend on
/// it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchOrder {
    /// In stored order (by shard, then index). The stored order is itself a seeded uniform
    /// shuffle, so this tells a model nothing, and it turns a batch's reads into a few
    /// ascending sweeps: at window 1 with blocks the size of a batch, one or two memcpys
    /// per column.
    #[default]
    Stored,
    /// In the order the window shuffle drew them.
    Drawn,
}

impl std::str::FromStr for BatchOrder {
    type Err = String;

    /// `stored` or `drawn`.
    fn from_str(s: &str) -> Result<BatchOrder, String> {
        match s {
            "stored" => Ok(BatchOrder::Stored),
            "drawn" => Ok(BatchOrder::Drawn),
            _ => Err(format!("batch order `{s}`: expected stored or drawn")),
        }
    }
}

impl std::fmt::Display for BatchOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BatchOrder::Stored => "stored",
            BatchOrder::Drawn => "drawn",
        })
    }
}

/// Whether the batches inside a window hold events of similar length.
///
/// A model that pads each batch to its longest event (a transformer's `[B, L]` grid) wastes
/// most of its grid on padding when batches are drawn at random: on data with the real
/// statistics, cut to 256 pulses, 30% of a 256-event batch's grid are pulses; grouped
/// within windows of 16 such batches, 91% (docs/loader.md). What it costs: a batch's events
/// are no longer a uniform sample of the window (each batch is one length class, and the
/// classes come in a random order), as with Hugging Face's `group_by_length` and the
/// competition's length-matched batch samplers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LengthGrouping {
    /// Batches drawn at random from the window.
    #[default]
    Off,
    /// Batches of events of similar pulse count, counts above `cap` (when given) counting as
    /// `cap`: a model that cuts events to `cap` pulses sees them all as one length, and the
    /// batches of its longest class hold a random sample of the long events.
    Pulses {
        /// The pulse count above which events count as equally long.
        cap: Option<usize>,
    },
    /// Batches of events of similar DOM count, counts above `cap` counting as `cap`: for
    /// DOM-level models, and the padded layout, whose `[B, M, F]` grid is as wide as the
    /// batch's most DOMs (at most `max_doms`: give it as `cap`).
    Doms {
        /// The DOM count above which events count as equally long.
        cap: Option<usize>,
    },
}

impl LengthGrouping {
    /// Grouped by `length`, capped at `cap`: the inverse of
    /// [`LengthGrouping::length_and_cap`].
    pub fn of(length: EventLength, cap: Option<usize>) -> LengthGrouping {
        match length {
            EventLength::Pulses => LengthGrouping::Pulses { cap },
            EventLength::Doms => LengthGrouping::Doms { cap },
        }
    }

    /// What lengths are counted in and their cap; `None` when off.
    pub fn length_and_cap(self) -> Option<(EventLength, Option<usize>)> {
        match self {
            LengthGrouping::Off => None,
            LengthGrouping::Pulses { cap } => Some((EventLength::Pulses, cap)),
            LengthGrouping::Doms { cap } => Some((EventLength::Doms, cap)),
        }
    }
}

/// As the loader's arguments `group_by_length` and `length_of` spell it: `off`, `pulses`,
/// `pulses up to 256` or `doms up to 128`.
impl std::fmt::Display for LengthGrouping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.length_and_cap() {
            None => f.write_str("off"),
            Some((length, None)) => write!(f, "{length}"),
            Some((length, Some(cap))) => write!(f, "{length} up to {cap}"),
        }
    }
}

/// What an event's length is counted in ([`LengthGrouping`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventLength {
    /// Its pulses (a sequence model's tokens).
    Pulses,
    /// Its DOMs (a DOM-level model's tokens; the padded layout's rows).
    Doms,
}

impl std::fmt::Display for EventLength {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EventLength::Pulses => "pulses",
            EventLength::Doms => "doms",
        })
    }
}

impl std::str::FromStr for EventLength {
    type Err = String;

    /// `pulses` or `doms`.
    fn from_str(s: &str) -> Result<EventLength, String> {
        match s {
            "pulses" => Ok(EventLength::Pulses),
            "doms" => Ok(EventLength::Doms),
            _ => Err(format!("`{s}`: expected pulses or doms")),
        }
    }
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
    /// The order of events inside each batch.
    #[serde(default)]
    pub batch_order: BatchOrder,
    /// `false`: no shuffle at all, every epoch the stored order (evaluation, inference):
    /// neither rotation nor block permutation nor window draws, so blocks, windows, runs
    /// and the batch order change nothing; but `group_by_length` still groups each window's
    /// batches, shortest first (inference over length-matched batches), and a token budget
    /// still cuts each window on its own.
    #[serde(default = "shuffled")]
    pub shuffle: bool,
    /// Batches of events of similar length inside each window (fixed-size batches, or cut
    /// by a token budget, which needs it).
    #[serde(default)]
    pub group_by_length: LengthGrouping,
    /// Drop incomplete trailing batches (see the module docs).
    pub drop_last: bool,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
}

fn shuffled() -> bool {
    true
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            seed: 0,
            block_events: 256,
            window_blocks: 16,
            run_events: 1,
            batching: Batching::Events(256),
            batch_order: BatchOrder::Stored,
            shuffle: true,
            group_by_length: LengthGrouping::Off,
            drop_last: false,
            rank: 0,
            world: 1,
        }
    }
}

impl SamplerConfig {
    /// Rejects configurations that cannot work, with a message naming the field.
    pub fn validate(&self) -> crate::Result<()> {
        use crate::Error;
        for (field, value) in [
            ("block_events", self.block_events),
            ("window_blocks", self.window_blocks),
            ("run_events", self.run_events),
        ] {
            if value == 0 {
                return Err(Error::config(field, "must be at least 1"));
            }
        }
        if self
            .block_events
            .checked_mul(self.window_blocks)
            .is_none_or(|n| n > u32::MAX as usize)
        {
            return Err(Error::config(
                "window_blocks",
                "a window (block size x window) must hold at most 2^32 - 1 events",
            ));
        }
        if self.world == 0 {
            return Err(Error::config("world", "must be at least 1"));
        }
        if self.rank >= self.world {
            return Err(Error::config(
                "rank",
                format!("{} must be below world size {}", self.rank, self.world),
            ));
        }
        match (self.group_by_length.length_and_cap(), self.batching) {
            (Some((_, Some(0))), _) => {
                return Err(Error::config(
                    "group_by_length",
                    "the cap must be at least 1",
                ))
            }
            (Some(_), Batching::Pulses { .. }) => {
                return Err(Error::config(
                    "group_by_length",
                    "groups batches of a fixed number of events (batch_events) or cut by a \
                     budget of padded tokens (max_tokens), not batches cut by a pulse budget \
                     (max_pulses)",
                ))
            }
            (None, Batching::Tokens { .. }) => {
                return Err(Error::config(
                    "max_tokens",
                    "bounds the padded grid of batches grouped by length: set \
                     group_by_length too (max_pulses bounds the pulses of batches drawn at \
                     random)",
                ))
            }
            _ => {}
        }
        let (kind, budget) = match self.batching {
            Batching::Events(0) => {
                return Err(Error::config("batching", "at least 1 event per batch"))
            }
            Batching::Events(_) => return Ok(()),
            Batching::Pulses {
                pulse_cap: Some(0), ..
            } => return Err(Error::config("pulse_cap", "must be at least 1")),
            Batching::Pulses { max_pulses, .. } => ("pulse", max_pulses),
            Batching::Tokens {
                pad_to_multiple_of: Some(0),
                ..
            } => return Err(Error::config("pad_to_multiple_of", "must be at least 1")),
            Batching::Tokens { max_tokens, .. } => ("token", max_tokens),
        };
        if budget == 0 || self.batching.max_events() == Some(0) {
            return Err(Error::config(
                "batching",
                format!("{kind} budget and event cap must be at least 1"),
            ));
        }
        Ok(())
    }
}

impl SamplerConfig {
    /// Checks that a position saved under `saved` means the same events here: every setting
    /// that decides the epoch's order (seed, block size, window, runs, batching, batch
    /// order, shuffle, length grouping) must be equal; rank, world and `drop_last` may
    /// differ (an elastic resume, see [`SamplerState::resumed`]). The error names the first field that differs,
    /// with both values.
    pub fn check_resumable(&self, saved: &SamplerConfig) -> crate::Result<()> {
        let differs = |field: &'static str, saved: String, ours: String| {
            Err(crate::Error::config(
                field,
                format!("the saved state has {saved}, this loader {ours}"),
            ))
        };
        macro_rules! same {
            ($($field:ident),*) => {$(
                if saved.$field != self.$field {
                    return differs(
                        stringify!($field),
                        saved.$field.to_string(),
                        self.$field.to_string(),
                    );
                }
            )*};
        }
        same!(
            seed,
            block_events,
            window_blocks,
            run_events,
            batching,
            batch_order,
            shuffle,
            group_by_length
        );
        Ok(())
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

impl EventRef {
    /// How many of `events`, from the first on, are consecutive events of one shard (a
    /// block's events come in such runs): 0 when there are none.
    pub fn run_len(events: &[EventRef]) -> usize {
        let consecutive = |w: &[EventRef]| w[1].shard == w[0].shard && w[1].index == w[0].index + 1;
        match events {
            [] => 0,
            _ => 1 + events.windows(2).take_while(|w| consecutive(w)).count(),
        }
    }
}

/// The sizes the sampler needs to know: events per shard, pulses per event (shared by the
/// loader's workers, hence `Sync`).
pub trait EventSizes: Sync {
    /// Events in each shard, in manifest order.
    fn shard_events(&self) -> Vec<usize>;
    /// Pulses of one event (asked only when batching by a pulse budget or grouping by
    /// length).
    fn pulses(&self, event: EventRef) -> usize;
    /// DOMs of one event (asked only when grouping by DOM count).
    fn doms(&self, event: EventRef) -> usize;
    /// The `length` of each of `events`, appended to `out` in order (a window's events, to
    /// group its batches by length): by default [`EventSizes::pulses`] or
    /// [`EventSizes::doms`] each, which a memory-mapped dataset speeds up by reading runs
    /// of consecutive events together.
    fn lengths_into(&self, events: &[EventRef], length: EventLength, out: &mut Vec<usize>) {
        out.extend(events.iter().map(|&e| self.length(e, length)));
    }
    /// One event's `length`: [`EventSizes::pulses`] or [`EventSizes::doms`].
    fn length(&self, event: EventRef, length: EventLength) -> usize {
        match length {
            EventLength::Pulses => self.pulses(event),
            EventLength::Doms => self.doms(event),
        }
    }
    /// A hint that events `events` of `shard` will be read soon, given when the window
    /// before theirs opens: a memory-mapped dataset asks the kernel to read them ahead.
    /// Nothing by default.
    fn read_ahead(&self, _shard: u32, _events: std::ops::Range<u32>) {}
}

/// One batch: its global number in the epoch and its events in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPlan {
    /// The global batch number within the epoch (`% world` is its rank).
    pub global_index: u64,
    /// Events in delivery order.
    pub events: Vec<EventRef>,
}

/// Where a rank stands: the small value a training job saves in its checkpoint.
///
/// Rank `r` of `world` takes, from global batch `origin` on, the batches
/// `origin + r`, `origin + r + world`, ...; it has taken `batches_taken` of them. A fresh
/// epoch has `origin` 0, so rank `r` takes the global batches `k` with `k % world == r`.
/// A state saved at one world size resumes at another through [`SamplerState::resumed`]:
/// the ranks of the new world deal the remaining global batches among themselves from the
/// global position the old world had reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Current epoch.
    pub epoch: u64,
    /// Batches this rank has taken in that epoch (since `origin`).
    pub batches_taken: u64,
    /// The global batches of the epoch all ranks together had consumed before this rank's
    /// count began: 0 but after an elastic resume.
    #[serde(default)]
    pub origin: u64,
}

impl SamplerState {
    /// The start of `epoch`.
    pub const fn start(epoch: u64) -> SamplerState {
        SamplerState::at(epoch, 0)
    }

    /// After this rank's first `batches_taken` batches of `epoch`.
    pub const fn at(epoch: u64, batches_taken: u64) -> SamplerState {
        SamplerState {
            epoch,
            batches_taken,
            origin: 0,
        }
    }

    /// The global batches consumed by all ranks of `world` together, when each took
    /// `batches_taken` (as the ranks of a data-parallel job do, step by step). Saved by a
    /// rank that took more than another (the end of an epoch without `drop_last`), it counts
    /// batches that rank's peers never had: save rank 0's state, which is never behind.
    pub fn global_batches(&self, world: usize) -> u64 {
        self.origin + self.batches_taken * world as u64
    }

    /// The position of any rank of a new world that resumes a state saved at `saved_world`:
    /// the same epoch, from the global position the saved world had reached. When that
    /// position is not a multiple of the new world, nothing changes: the remaining batches
    /// are dealt from it, `origin + r` to rank `r`, and so on round-robin.
    pub fn resumed(&self, saved_world: usize) -> SamplerState {
        SamplerState {
            epoch: self.epoch,
            batches_taken: 0,
            origin: self.global_batches(saved_world),
        }
    }
}
