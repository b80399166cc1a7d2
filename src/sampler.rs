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
//! 4. the resulting global event sequence is cut into batches: `Events(n)` takes `n`
//!    events at a time; `Pulses { max_pulses, max_events }` adds events while the batch stays
//!    within the pulse budget (an event larger than the budget forms a batch of its own);
//!    with [`BatchOrder::Stored`] (the default) a batch's events are then put in stored
//!    order, which changes no batch's content;
//! 5. global batch `k` goes to rank `k % world`.
//!
//! The global sequence depends only on the dataset, seed, epoch, block size, window,
//! batching and batch order, never on the world size or thread counts. Without `drop_last`
//! every event is delivered exactly once per epoch across ranks (ranks' batch counts differ
//! by at most one). With `drop_last` the final batch is dropped when it is incomplete
//! (fewer than `n` events; in pulse mode, closed by the end of the epoch rather than by the
//! budget), then trailing batches are dropped until every rank has the same number: at
//! most `world` batches' worth of events are skipped, and they differ from epoch to epoch.
//!
//! When the block size is a multiple of the batch size, no batch but the last straddles
//! two windows: at window 1 with blocks the size of a batch, a batch is one whole block, so
//! in stored order it is one contiguous run of each shard column (two where the block
//! crosses a shard boundary).
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

/// As the loader's arguments name it: `batch_events 256`, `max_pulses 4096` or
/// `max_pulses 4096, max_events 64`.
impl std::fmt::Display for Batching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Batching::Events(events) => write!(f, "batch_events {events}"),
            Batching::Pulses {
                max_pulses,
                max_events,
            } => {
                write!(f, "max_pulses {max_pulses}")?;
                match max_events {
                    Some(events) => write!(f, ", max_events {events}"),
                    None => Ok(()),
                }
            }
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
    /// and the batch order change nothing.
    #[serde(default = "shuffled")]
    pub shuffle: bool,
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
        match self.batching {
            Batching::Events(0) => Err(Error::config("batching", "at least 1 event per batch")),
            Batching::Pulses { max_pulses: 0, .. }
            | Batching::Pulses {
                max_events: Some(0),
                ..
            } => Err(Error::config(
                "batching",
                "pulse budget and event cap must be at least 1",
            )),
            _ => Ok(()),
        }
    }
}

impl SamplerConfig {
    /// Checks that a position saved under `saved` means the same events here: every setting
    /// that decides the epoch's order (seed, block size, window, runs, batching, batch
    /// order, shuffle) must be equal; rank, world and `drop_last` may differ (an elastic
    /// resume, see [`SamplerState::resumed`]). The error names the first field that differs,
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
            shuffle
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

/// The sizes the sampler needs to know: events per shard, pulses per event (shared by the
/// loader's workers, hence `Sync`).
pub trait EventSizes: Sync {
    /// Events in each shard, in manifest order.
    fn shard_events(&self) -> Vec<usize>;
    /// Pulses of one event (asked only when batching by a pulse budget).
    fn pulses(&self, event: EventRef) -> usize;
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

/// `len` consecutive events of the stored order from global position `start`.
#[derive(Debug, Clone, Copy)]
struct Block {
    start: u64,
    len: u64,
}

const STREAM_BLOCKS: u64 = 0x0b10_c4b1;
const STREAM_WINDOW: u64 = 0x3a7d_0e11;

const STREAM_ROTATION: u64 = 0x5107_a7e5;

/// The stored order (shards concatenated in manifest order), rotated by an epoch's offset:
/// position `p` is the event at stored position `(p + rotation) % total`.
#[derive(Debug, Clone)]
struct StoredOrder {
    /// Stored position of each shard's first event, and the total at the end.
    shard_starts: Vec<u64>,
    rotation: u64,
}

impl StoredOrder {
    fn new(shard_events: &[usize], rotation: impl FnOnce(u64) -> u64) -> StoredOrder {
        let mut shard_starts = Vec::with_capacity(shard_events.len() + 1);
        let mut total = 0u64;
        shard_starts.push(0);
        for &n in shard_events {
            total += n as u64;
            shard_starts.push(total);
        }
        let rotation = if total == 0 { 0 } else { rotation(total) };
        StoredOrder {
            shard_starts,
            rotation,
        }
    }

    fn total(&self) -> u64 {
        *self.shard_starts.last().expect("at least the total")
    }

    /// Appends the events at (rotated) positions `start..end` to `out`.
    fn extend(&self, start: u64, end: u64, out: &mut Vec<EventRef>) {
        self.pieces(start, end, |shard, indexes| {
            out.extend(indexes.map(|index| EventRef { shard, index }))
        });
    }

    /// Calls `piece` with each shard's run of the events at (rotated) positions
    /// `start..end`, in order.
    fn pieces(&self, start: u64, end: u64, mut piece: impl FnMut(u32, std::ops::Range<u32>)) {
        // Rotated position `wrap` is stored position 0.
        let wrap = self.total() - self.rotation;
        if start < wrap {
            let (a, b) = (start + self.rotation, end.min(wrap) + self.rotation);
            self.stored_pieces(a, b, &mut piece);
        }
        if end > wrap {
            self.stored_pieces(start.max(wrap) - wrap, end - wrap, &mut piece);
        }
    }

    /// As [`StoredOrder::pieces`], for stored positions `start..end` (`end <= total`).
    fn stored_pieces(
        &self,
        start: u64,
        end: u64,
        piece: &mut impl FnMut(u32, std::ops::Range<u32>),
    ) {
        // The last shard starting at or before `start` (empty shards skipped).
        let mut shard = self.shard_starts.partition_point(|&s| s <= start) - 1;
        let mut position = start;
        while position < end {
            let shard_end = self.shard_starts[shard + 1];
            let stop = end.min(shard_end);
            let first = position - self.shard_starts[shard];
            piece(shard as u32, first as u32..(first + stop - position) as u32);
            position = stop;
            shard += 1;
        }
    }
}

/// The global event sequence of one epoch, produced window by window (memory bounded by a
/// window, whatever the epoch length).
struct EventStream {
    stored: StoredOrder,
    blocks: Vec<Block>,
    window_blocks: usize,
    run_events: u64,
    /// `false`: the stored order (see [`SamplerConfig::shuffle`]).
    shuffle: bool,
    seed: u64,
    epoch: u64,
    next_window: usize,
    window: Window,
    /// Windows whose events were announced through [`EventSizes::read_ahead`].
    announced: usize,
}

/// One window's events and the order they are drawn in.
#[derive(Debug, Default)]
struct Window {
    /// The window's events in rotated order (its blocks sorted by start): in stored order
    /// but for at most one wrap from the last shard to the first.
    events: Vec<EventRef>,
    /// Indexes into `events`, in drawn order.
    drawn: Vec<u32>,
    /// How many of `drawn` were handed out.
    taken: usize,
}

/// The memory a batch's events are put in stored order with: one bit per event of the
/// window, or a radix sort's buffers. Written for every batch, so it is kept where the
/// planning happens ([`EpochBatches::next_reusing`]): the loader keeps one with its
/// sampler, which a thread takes for 16 batches at a time. Threads planning in turn, one
/// batch each, through one scratch passed its lines from core to core with every batch,
/// which costs most where the cores share no cache.
#[derive(Debug, Default)]
pub struct PlanScratch {
    bitmap: Vec<u64>,
    sorting: RadixScratch,
}

impl Window {
    fn remaining(&self) -> usize {
        self.drawn.len() - self.taken
    }

    /// The next event to hand out.
    fn peek(&self, ahead: usize) -> EventRef {
        self.events[self.drawn[self.taken + ahead] as usize]
    }

    /// Hands out the next `n` events, appended to `out` in drawn or in stored order (put
    /// in order in `scratch`).
    fn take(
        &mut self,
        n: usize,
        order: BatchOrder,
        out: &mut Vec<EventRef>,
        scratch: &mut PlanScratch,
    ) {
        let piece = &self.drawn[self.taken..self.taken + n];
        self.taken += n;
        let from = out.len();
        match order {
            BatchOrder::Drawn => out.extend(piece.iter().map(|&i| self.events[i as usize])),
            BatchOrder::Stored if self.events.len() <= BITMAP_SPREAD * n => {
                // Sorted through a bitmap of the window: linear, where a comparison sort
                // of a 256-event batch costs 2.5 µs, as much as gathering 50 KB. Dense
                // words (a small window) cost a word each; sparse ones a mispredicted
                // branch each, where the radix sort below has none.
                let bits = &mut scratch.bitmap;
                bits.clear();
                bits.resize(self.events.len().div_ceil(64), 0);
                for &i in piece {
                    bits[i as usize / 64] |= 1 << (i % 64);
                }
                for (w, &word) in bits.iter().enumerate() {
                    let mut word = word;
                    while word != 0 {
                        out.push(self.events[w * 64 + word.trailing_zeros() as usize]);
                        word &= word - 1;
                    }
                }
            }
            BatchOrder::Stored => {
                let sorted = radix_sort(piece, self.events.len(), &mut scratch.sorting);
                out.extend(sorted.iter().map(|&i| self.events[i as usize]));
            }
        }
        if order == BatchOrder::Stored {
            // Rotated order is stored order from the rotation offset on: bring the events
            // past the wrap (the first shard's) to the front.
            let piece = &mut out[from..];
            if let Some(wrap) = piece.windows(2).position(|w| w[1] < w[0]) {
                piece.rotate_left(wrap + 1);
            }
        }
    }
}

/// A piece of a batch is put in stored order through a bitmap of its window when the
/// window holds at most this many times as many events as the piece (4 bits a word on
/// average), else by [`radix_sort`]. Planning costs the same either way at 16 (window 16
/// with blocks the size of a batch); at 64 it took 2.2 µs a batch with the bitmap, 1.4
/// with the radix sort (the sampler's whole order, 2-core Zen 5, docs/results.md).
const BITMAP_SPREAD: usize = 16;

/// Bits of the digits [`radix_sort`] sorts by, at most.
const RADIX_BITS: u32 = 8;

/// The buffers [`radix_sort`] reuses from one call to the next.
#[derive(Debug, Default)]
struct RadixScratch {
    keys: Vec<u32>,
    swap: Vec<u32>,
    counts: Vec<u32>,
}

/// `keys` (each below `bound`), ascending, in `scratch`: a least-significant-digit radix
/// sort, one counting pass per digit of at most [`RADIX_BITS`] bits (two for windows up to
/// 65,536 events). No comparisons and no branch on the data, where the bitmap's sparse
/// words cost a mispredicted branch each.
fn radix_sort<'s>(keys: &[u32], bound: usize, scratch: &'s mut RadixScratch) -> &'s [u32] {
    let bits = usize::BITS - bound.saturating_sub(1).leading_zeros();
    let passes = bits.div_ceil(RADIX_BITS).max(1);
    let width = bits.div_ceil(passes);
    let RadixScratch {
        keys: from,
        swap: to,
        counts,
    } = scratch;
    from.clear();
    from.extend_from_slice(keys);
    to.clear();
    to.resize(keys.len(), 0);
    for pass in 0..passes {
        let (shift, mask) = (pass * width, (1u32 << width) - 1);
        counts.clear();
        counts.resize(1 << width, 0);
        for &k in from.iter() {
            counts[((k >> shift) & mask) as usize] += 1;
        }
        let mut sum = 0;
        for c in counts.iter_mut() {
            (*c, sum) = (sum, sum + *c);
        }
        for &k in from.iter() {
            let slot = &mut counts[((k >> shift) & mask) as usize];
            to[*slot as usize] = k;
            *slot += 1;
        }
        std::mem::swap(from, to);
    }
    from
}

impl EventStream {
    fn new(shard_events: &[usize], config: &SamplerConfig, epoch: u64) -> EventStream {
        let stored = StoredOrder::new(shard_events, |total| match config.shuffle {
            true => Rng::stream(config.seed ^ STREAM_ROTATION, epoch).below(total),
            false => 0,
        });
        let size = config.block_events as u64;
        let mut blocks: Vec<Block> = (0..stored.total().div_ceil(size))
            .map(|b| Block {
                start: b * size,
                len: size.min(stored.total() - b * size),
            })
            .collect();
        // The short block, if any, stays last: a short block in the middle of the epoch
        // would shift every later batch off the block boundaries.
        let full = (stored.total() / size) as usize;
        if config.shuffle {
            Rng::stream(config.seed ^ STREAM_BLOCKS, epoch).shuffle(&mut blocks[..full]);
        }
        EventStream {
            stored,
            blocks,
            window_blocks: config.window_blocks,
            run_events: config.run_events as u64,
            shuffle: config.shuffle,
            seed: config.seed,
            epoch,
            next_window: 0,
            window: Window::default(),
            announced: 0,
        }
    }

    /// Announces the events of the windows up to the one after the current, not announced
    /// yet, to `sizes` (see [`EventSizes::read_ahead`]).
    fn announce(&mut self, sizes: &dyn EventSizes) {
        let through = (self.next_window + 1).min(self.blocks.len().div_ceil(self.window_blocks));
        while self.announced < through {
            let first = self.announced * self.window_blocks;
            let last = (first + self.window_blocks).min(self.blocks.len());
            for b in &self.blocks[first..last] {
                self.stored
                    .pieces(b.start, b.start + b.len, |shard, events| {
                        sizes.read_ahead(shard, events)
                    });
            }
            self.announced += 1;
        }
    }

    /// The current window while it has events left, else the next one; `None` at the end
    /// of the epoch.
    fn window(&mut self) -> Option<&mut Window> {
        while self.window.remaining() == 0 {
            let first = self.next_window * self.window_blocks;
            if first >= self.blocks.len() {
                return None;
            }
            let mut blocks =
                self.blocks[first..(first + self.window_blocks).min(self.blocks.len())].to_vec();
            blocks.sort_unstable_by_key(|b| b.start);
            let w = &mut self.window;
            w.events.clear();
            w.drawn.clear();
            w.taken = 0;
            let mut runs: Vec<(u32, u32)> = Vec::new();
            for b in &blocks {
                let first_event = w.events.len() as u64;
                self.stored.extend(b.start, b.start + b.len, &mut w.events);
                if self.run_events > 1 {
                    runs.extend((0..b.len).step_by(self.run_events as usize).map(|start| {
                        let len = self.run_events.min(b.len - start);
                        ((first_event + start) as u32, len as u32)
                    }));
                }
            }
            let stream = (self.epoch << 32) ^ self.next_window as u64;
            let mut rng = Rng::stream(self.seed ^ STREAM_WINDOW, stream);
            if !self.shuffle {
                w.drawn.extend(0..w.events.len() as u32);
            } else if self.run_events > 1 {
                rng.shuffle(&mut runs);
                w.drawn
                    .extend(runs.iter().flat_map(|&(start, len)| start..start + len));
            } else {
                w.drawn.extend(0..w.events.len() as u32);
                rng.shuffle(&mut w.drawn);
            }
            self.next_window += 1;
        }
        Some(&mut self.window)
    }
}

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

    /// The next batch, and whether it is complete (see `drop_last`): its events are
    /// planned in `events` (emptied first, its memory reused) and taken out of it; without
    /// a next batch, `events` keeps its memory.
    fn next_batch(
        &mut self,
        events: &mut Vec<EventRef>,
        scratch: &mut PlanScratch,
    ) -> Option<(BatchPlan, bool)> {
        let capacity = match self.batching {
            Batching::Events(n) => n,
            Batching::Pulses { max_events, .. } => max_events.unwrap_or(0),
        };
        events.clear();
        events.reserve(capacity.min(1 << 16));
        let mut plan = BatchPlan {
            global_index: self.next_index,
            events: std::mem::take(events),
        };
        let (mut batch_pulses, mut pieces) = (0, 0);
        // Taken window by window: each window's piece is put in order on its own.
        let complete = loop {
            if self.read_ahead {
                self.events.announce(self.sizes);
            }
            let Some(window) = self.events.window() else {
                break false;
            };
            let (n, full) = match self.batching {
                Batching::Events(n) => {
                    let k = (n - plan.events.len()).min(window.remaining());
                    (k, plan.events.len() + k == n)
                }
                Batching::Pulses {
                    max_pulses,
                    max_events,
                } => {
                    let (mut k, mut full) = (0, false);
                    while k < window.remaining() {
                        let pulses = self.sizes.pulses(window.peek(k));
                        let held = plan.events.len() + k;
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
            };
            window.take(n, self.order, &mut plan.events, scratch);
            pieces += 1;
            if full {
                break true;
            }
        };
        if plan.events.is_empty() {
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
    let mut counting = GlobalBatches::new(sizes, config, epoch, false);
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
fn delivered_global_batches(
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
    /// Global batches to deliver (across ranks) when `drop_last` trims the epoch.
    limit: Option<u64>,
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
        let limit = config
            .drop_last
            .then(|| delivered_global_batches(sizes, config, position.epoch, position.origin));
        // At window 1 the reads sweep one block at a time, which the kernel's own read-ahead
        // follows: announcing the next block there measured 15% slower cold epochs, while at
        // window 16 it measured 12% faster (0.58-0.67 -> 0.70-0.77 of the disk's rate).
        let read_ahead = config.window_blocks > 1;
        let mut batches = EpochBatches {
            global: GlobalBatches::new(sizes, config, position.epoch, read_ahead),
            config: config.clone(),
            origin: position.origin,
            limit,
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
            let (plan, _) = self.global.next_batch(events, scratch)?;
            if self.limit.is_some_and(|l| plan.global_index >= l) {
                *events = plan.events;
                return None;
            }
            let k = plan.global_index;
            if k >= self.origin && (k - self.origin) % world == rank {
                return Some(plan);
            }
            *events = plan.events; // another rank's batch
        }
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
        EpochBatches::new(sizes, config, SamplerState::start(epoch)).collect()
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

    fn order() -> impl Strategy<Value = BatchOrder> {
        prop_oneof![Just(BatchOrder::Stored), Just(BatchOrder::Drawn)]
    }

    #[test]
    fn a_refused_resume_names_the_setting_as_the_loader_takes_it() {
        let saved = SamplerConfig {
            batching: Batching::Events(7),
            ..SamplerConfig::default()
        };
        let refusal = |ours: SamplerConfig| ours.check_resumable(&saved).unwrap_err().to_string();
        let other_batching = SamplerConfig {
            batching: Batching::Events(8),
            ..saved.clone()
        };
        assert_eq!(
            refusal(other_batching),
            "invalid batching: the saved state has batch_events 7, this loader batch_events 8"
        );
        let pulses = |max_events| SamplerConfig {
            batching: Batching::Pulses {
                max_pulses: 4096,
                max_events,
            },
            ..saved.clone()
        };
        assert!(refusal(pulses(None)).ends_with("this loader max_pulses 4096"));
        assert!(refusal(pulses(Some(64))).ends_with("this loader max_pulses 4096, max_events 64"));
        let other_order = SamplerConfig {
            batch_order: BatchOrder::Drawn,
            ..saved.clone()
        };
        assert_eq!(
            refusal(other_order),
            "invalid batch_order: the saved state has stored, this loader drawn"
        );
        let another_world = SamplerConfig {
            world: 3,
            rank: 2,
            drop_last: true,
            ..saved.clone()
        };
        assert!(another_world.check_resumable(&saved).is_ok());
    }

    /// Each event's position in the stored order (shards concatenated).
    fn stored_position(sizes: &Sizes, e: EventRef) -> u64 {
        sizes.0[..e.shard as usize].iter().sum::<usize>() as u64 + u64::from(e.index)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn every_event_once_per_epoch_across_ranks(
            shards in proptest::collection::vec(0usize..300, 1..6),
            seed in any::<u64>(), epoch in 0u64..5, block in 1usize..64, window in 1usize..8,
            batching in batching(), world in 1usize..9, run in 1usize..12, batch_order in order(),
        ) {
            let sizes = Sizes(shards.clone());
            let total: usize = shards.iter().sum();
            let base = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, batch_order, shuffle: true, drop_last: false, rank: 0, world: 1 };
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
            batching in batching(), world in 1usize..9, run in 1usize..12, batch_order in order(),
        ) {
            let sizes = Sizes(shards.clone());
            let base = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, batch_order, shuffle: true, drop_last: true, rank: 0, world };
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
        fn rank_batch_count_is_what_the_epoch_yields(
            shards in proptest::collection::vec(0usize..300, 1..6),
            seed in any::<u64>(), epoch in 0u64..3, block in 1usize..64, window in 1usize..8,
            batching in batching(), world in 1usize..9, drop_last: bool, batch_order in order(),
        ) {
            let sizes = Sizes(shards);
            for rank in 0..world {
                let config = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: 1, batching, batch_order, shuffle: true, drop_last, rank, world };
                let yielded = all(&sizes, &config, epoch).len() as u64;
                prop_assert_eq!(rank_batch_count(&sizes, &config, epoch, 0), yielded, "rank {} of {}", rank, world);
            }
        }

        #[test]
        fn resume_yields_exactly_the_rest(
            shards in proptest::collection::vec(1usize..200, 1..4), seed in any::<u64>(),
            batching in batching(), world in 1usize..4, rank_pick in 0usize..4, skip in 0u64..30, drop_last: bool,
            run in 1usize..12, batch_order in order(),
        ) {
            let sizes = Sizes(shards);
            let config = SamplerConfig { seed, block_events: 16, window_blocks: 3, run_events: run, batching, batch_order, shuffle: true, drop_last, rank: rank_pick % world, world };
            let whole = all(&sizes, &config, 2);
            let rest: Vec<BatchPlan> = EpochBatches::new(&sizes, &config, SamplerState::at(2, skip)).collect();
            prop_assert_eq!(&rest[..], &whole[(skip as usize).min(whole.len())..]);
        }

        #[test]
        fn a_state_resumes_at_any_world_size(
            shards in proptest::collection::vec(1usize..200, 1..4), seed in any::<u64>(),
            batching in batching(), world in 1usize..6, new_world in 1usize..9, taken in 0u64..12,
            drop_last: bool, new_drop_last: bool, run in 1usize..6,
        ) {
            let sizes = Sizes(shards);
            let base = SamplerConfig { seed, block_events: 16, window_blocks: 3, run_events: run, batching, drop_last, world, ..SamplerConfig::default() };
            let every = all(&sizes, &SamplerConfig { world: 1, drop_last: false, ..base.clone() }, 1);
            // Every rank of the old world took `taken` batches (or all it had), then stopped.
            let mut seen: Vec<u64> = Vec::new();
            let mut saved = None;
            for rank in 0..world {
                let config = SamplerConfig { rank, ..base.clone() };
                let mut batches = EpochBatches::new(&sizes, &config, SamplerState::start(1));
                let first: Vec<BatchPlan> = batches.by_ref().take(taken as usize).collect();
                seen.extend(first.iter().map(|b| b.global_index));
                let state = SamplerState::at(1, first.len() as u64);
                if rank == 0 {
                    saved = Some(state);
                }
            }
            let saved = saved.unwrap();
            let resumed = SamplerState::resumed(&saved, world);
            prop_assert_eq!(resumed.origin, saved.batches_taken * world as u64);
            let new = SamplerConfig { world: new_world, drop_last: new_drop_last, ..base.clone() };
            prop_assert!(new.check_resumable(&base).is_ok());
            let mut counts = BTreeSet::new();
            for rank in 0..new_world {
                let config = SamplerConfig { rank, ..new.clone() };
                let rest: Vec<BatchPlan> = EpochBatches::new(&sizes, &config, resumed).collect();
                prop_assert_eq!(rest.len() as u64, rank_batch_count(&sizes, &config, 1, resumed.origin));
                counts.insert(rest.len());
                seen.extend(rest.iter().map(|b| b.global_index));
            }
            let unique: BTreeSet<u64> = seen.iter().copied().collect();
            prop_assert_eq!(unique.len(), seen.len(), "no batch twice");
            let end = if new_drop_last {
                prop_assert!(counts.len() <= 1, "equal counts after the resume: {:?}", counts);
                delivered_global_batches(&sizes, &new, 1, resumed.origin)
            } else {
                every.len() as u64
            };
            // Nothing skipped: every global batch before the end, but what the old world's
            // drop_last had already cut off at its own end.
            let old_end = if drop_last { delivered_global_batches(&sizes, &base, 1, 0) } else { every.len() as u64 };
            let expected: BTreeSet<u64> = (0..end.max(resumed.origin.min(old_end))).filter(|&k| k < resumed.origin.min(old_end) || k >= resumed.origin).collect();
            prop_assert_eq!(unique, expected);
        }

        #[test]
        fn without_shuffle_every_epoch_is_the_stored_order(
            shards in proptest::collection::vec(0usize..300, 1..6), seed in any::<u64>(),
            block in 1usize..64, window in 1usize..8, batching in batching(), world in 1usize..5,
            run in 1usize..12, batch_order in order(), epoch in 0u64..4,
        ) {
            let sizes = Sizes(shards.clone());
            let config = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, batch_order, shuffle: false, world, ..SamplerConfig::default() };
            let mut union: Vec<BatchPlan> = (0..world).flat_map(|rank| all(&sizes, &SamplerConfig { rank, ..config.clone() }, epoch)).collect();
            union.sort_by_key(|b| b.global_index);
            let events: Vec<u64> = union.iter().flat_map(|b| b.events.iter().map(|&e| stored_position(&sizes, e))).collect();
            prop_assert_eq!(events, (0..shards.iter().sum::<usize>() as u64).collect::<Vec<_>>());
            let other = SamplerConfig { seed: seed ^ 1, block_events: block + 3, rank: 0, world: 1, ..config.clone() };
            let mut single = all(&sizes, &other, epoch + 1);
            for b in &mut single { b.global_index = 0; }
            for b in &mut union { b.global_index = 0; }
            prop_assert_eq!(single, union, "the same batches whatever the seed, blocks or epoch");
        }

        #[test]
        fn batch_order_changes_no_batch_content(
            shards in proptest::collection::vec(0usize..400, 1..5),
            seed in any::<u64>(), epoch in 0u64..4, block in 1usize..80, window in 1usize..20,
            batching in batching(), run in 1usize..6,
        ) {
            let sizes = Sizes(shards);
            let drawn = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: run, batching, batch_order: BatchOrder::Drawn, ..SamplerConfig::default() };
            let stored = SamplerConfig { batch_order: BatchOrder::Stored, ..drawn.clone() };
            let (a, b) = (all(&sizes, &stored, epoch), all(&sizes, &drawn, epoch));
            prop_assert_eq!(a.len(), b.len());
            for (a, b) in a.iter().zip(&b) {
                let mut sorted = b.events.clone();
                sorted.sort();
                prop_assert_eq!(&a.events, &sorted, "stored order: the drawn batch, sorted");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]

        #[test]
        fn a_reused_vector_changes_no_plan(
            shards in proptest::collection::vec(0usize..300, 1..6),
            seed in any::<u64>(), block in 1usize..64, window in 1usize..8,
            batching in batching(), world in 1usize..4, batch_order in order(),
            drop_last in any::<bool>(), stale in 0usize..600,
        ) {
            let sizes = Sizes(shards);
            let config = SamplerConfig { seed, block_events: block, window_blocks: window, run_events: 4, batching, batch_order, shuffle: true, drop_last, rank: world - 1, world };
            let expected = all(&sizes, &config, 1);
            // Each plan is made in the vector of the one before, first in one holding
            // events of another batch.
            let mut batches = EpochBatches::new(&sizes, &config, SamplerState::start(1));
            let mut reused = vec![EventRef { shard: 9, index: 9 }; stale];
            let mut planned = Vec::new();
            // Two scratches in turn, as two threads planning in turn use them.
            let mut scratches = [PlanScratch::default(), PlanScratch::default()];
            while let Some(plan) = batches.next_reusing(&mut reused, &mut scratches[planned.len() % 2]) {
                prop_assert!(reused.is_empty(), "the plan took the events out");
                planned.push(plan.clone());
                reused = plan.events;
            }
            prop_assert_eq!(planned, expected);
            prop_assert!(reused.capacity() >= stale, "the last vector kept its memory");
        }
    }

    #[test]
    fn radix_sort_sorts_keys_of_every_width() {
        let mut scratch = RadixScratch::default();
        let mut rng = crate::rng::Rng::new(7);
        // One pass (up to 8 bits), two, three and four; bounds just past a power of two
        // leave a short last digit.
        for bound in [
            1usize,
            2,
            3,
            200,
            256,
            257,
            4096,
            16_384,
            65_537,
            1 << 20,
            1 << 32,
        ] {
            for n in [0usize, 1, 2, 255, 1000] {
                let keys: Vec<u32> = (0..n).map(|_| rng.below(bound as u64) as u32).collect();
                let mut expected = keys.clone();
                expected.sort_unstable();
                let sorted = radix_sort(&keys, bound, &mut scratch);
                assert_eq!(sorted, &expected[..], "bound {bound}, {n} keys");
            }
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
            batch_order: BatchOrder::Drawn,
            ..SamplerConfig::default()
        };
        for epoch in 0..4 {
            let rotation = EventStream::new(&sizes.0, &config, epoch).stored.rotation;
            // Positions in the epoch's rotated order, where blocks start at multiples of 20.
            let rotated: Vec<u64> = all(&sizes, &config, epoch)
                .into_iter()
                .flat_map(|b| b.events)
                .map(|e| (stored_position(&sizes, e) + 137 - rotation) % 137)
                .collect();
            let mut i = 0;
            while i < rotated.len() {
                let p = rotated[i];
                // A run starts at a multiple of 8 inside its block, ends after 8 events or at
                // the block's end.
                assert_eq!((p % 20) % 8, 0, "epoch {epoch}: {p}");
                let len = 8.min(((p / 20 + 1) * 20).min(137) - p) as usize;
                assert_eq!(rotated[i..i + len], (p..p + len as u64).collect::<Vec<_>>());
                i += len;
            }
        }
    }

    #[test]
    fn window_one_batches_are_whole_blocks_in_stored_order() {
        let sizes = Sizes(vec![1000, 1000, 37]);
        let config = SamplerConfig {
            block_events: 50,
            window_blocks: 1,
            batching: Batching::Events(50),
            ..SamplerConfig::default()
        };
        let epochs: Vec<Vec<BatchPlan>> = (0..3).map(|e| all(&sizes, &config, e)).collect();
        assert_ne!(epochs[0], epochs[1]);
        let mut short_blocks = BTreeSet::new();
        for batches in &epochs {
            let (last, full) = batches.split_last().unwrap();
            assert_eq!(last.events.len(), 2037 % 50, "the short block comes last");
            short_blocks.insert(last.events.clone());
            for b in batches {
                assert!(b.events.windows(2).all(|w| w[0] < w[1]), "stored order");
                // One block: consecutive stored positions, cyclically (rotated epochs wrap).
                let mut p: Vec<u64> = b
                    .events
                    .iter()
                    .map(|&e| stored_position(&sizes, e))
                    .collect();
                let gap = p.windows(2).position(|w| w[1] != w[0] + 1);
                if let Some(g) = gap {
                    assert_eq!(
                        (p[0], *p.last().unwrap()),
                        (0, 2036),
                        "only the wrap breaks a block"
                    );
                    p.rotate_left(g + 1);
                }
                assert!(p.windows(2).all(|w| (w[0] + 1) % 2037 == w[1]), "{p:?}");
                if full.contains(b) {
                    assert_eq!(b.events.len(), 50);
                }
            }
        }
        assert_eq!(
            short_blocks.len(),
            3,
            "the short block holds other events each epoch"
        );
    }
}
