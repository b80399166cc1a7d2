//! The global event sequence of an epoch: the stored order rotated, cut into blocks,
//! permuted, and drawn window by window.

use super::regroup::Regrouping;
use super::stored_order::StoredOrder;
use super::window_events::WindowEvents;
use super::{BatchOrder, Batching, EventLength, EventRef, EventSizes, SamplerConfig};
use crate::rng::Rng;

/// `len` consecutive events of the stored order from global position `start`.
#[derive(Debug, Clone, Copy)]
struct Block {
    start: u64,
    len: u64,
}

const STREAM_BLOCKS: u64 = 0x0b10_c4b1;
const STREAM_WINDOW: u64 = 0x3a7d_0e11;

const STREAM_ROTATION: u64 = 0x5107_a7e5;
const STREAM_LENGTH_GROUPS: u64 = 0x1e96_7a05;

/// The global event sequence of one epoch, produced window by window (memory bounded by a
/// window, whatever the epoch length).
pub(super) struct EventStream {
    blocks: Vec<Block>,
    window_blocks: usize,
    run_events: u64,
    /// `false`: the stored order (see [`SamplerConfig::shuffle`]).
    shuffle: bool,
    seed: u64,
    epoch: u64,
    /// How each window's drawn order is regrouped.
    regrouping: Regrouping,
    /// Whether each window's pulses are read when it opens (see [`EventStream::window`]).
    reads_pulses: bool,
    /// Whether its batches are only counted (see [`EventStream::only_counted`]).
    counted: bool,
    next_window: usize,
    /// Events in the windows before the current one: the current one's first global
    /// position.
    window_start: u64,
    window: Window,
    /// Windows whose events were announced through [`EventSizes::read_ahead`].
    announced: usize,
}

/// One window's events and the order they are drawn in.
#[derive(Debug)]
pub(super) struct Window {
    /// The window's events.
    pub(super) events: WindowEvents,
    /// Indexes into `events`, in drawn order.
    pub(super) drawn: Vec<u32>,
    /// How many of `drawn` were handed out.
    taken: usize,
    /// Where each of its batches ends in `drawn`, in order, when the window is cut into
    /// batches on its own (a token budget); else empty.
    pub(super) batch_ends: Vec<u32>,
    /// Each event's pulses, in window order, read when the window opened (see
    /// [`EventStream::window`]); `None` where they are read a piece of the drawn order at
    /// a time (`drawn_pulses`).
    pulses: Option<Vec<u32>>,
    /// The pulses of a piece of the drawn order, where the window does not hold each
    /// event's.
    drawn_pulses: DrawnPulses,
}

/// The pulses of the drawn events from `start` on, read together (see
/// [`Window::pulses_ahead`]).
#[derive(Debug, Default)]
struct DrawnPulses {
    start: usize,
    pulses: Vec<usize>,
    events: Vec<EventRef>,
}

/// Drawn events whose pulses a window too big to hold each event's reads together.
const DRAWN_PULSES_PIECE: usize = 256;

/// The memory a batch's events are put in stored order with: one bit per event of the
/// window, or a radix sort's buffers. Written for every batch, so it is kept where the
/// planning happens ([`super::EpochBatches::next_reusing`]): the loader keeps one with its
/// sampler, which a thread takes for 16 batches at a time. Threads planning in turn, one
/// batch each, through one scratch passed its lines from core to core with every batch,
/// which costs most where the cores share no cache.
#[derive(Debug, Default)]
pub struct PlanScratch {
    bitmap: Vec<u64>,
    sorting: RadixScratch,
}

impl Window {
    pub(super) fn remaining(&self) -> usize {
        self.drawn.len() - self.taken
    }

    /// The events left before the end of the batch being handed out, when the window is cut
    /// into batches on its own (see [`Window::batch_ends`]); else all that are left.
    pub(super) fn until_batch_end(&self) -> usize {
        let next = self
            .batch_ends
            .partition_point(|&end| end as usize <= self.taken);
        match self.batch_ends.get(next) {
            Some(&end) => end as usize - self.taken,
            None => self.remaining(),
        }
    }

    /// The event `ahead` of the next to hand out.
    #[cfg(test)]
    pub(super) fn peek(&self, ahead: usize) -> EventRef {
        self.events.get(self.drawn[self.taken + ahead])
    }

    /// The pulses of the event `ahead` of the next to hand out: read when the window
    /// opened, or with the next [`DRAWN_PULSES_PIECE`] drawn events' from `sizes`, whose
    /// offsets' cache misses then overlap: planning an epoch in one window over 1M events
    /// took 237-241 ns an event with each event's pulses asked alone, 69-91 so (the plan
    /// bench's three runs alternated on a noisy 2-core Zen 4).
    pub(super) fn pulses_ahead(&mut self, ahead: usize, sizes: &dyn EventSizes) -> usize {
        let at = self.taken + ahead;
        if let Some(pulses) = &self.pulses {
            return pulses[self.drawn[at] as usize] as usize;
        }
        let read = &mut self.drawn_pulses;
        if !(read.start..read.start + read.pulses.len()).contains(&at) {
            let end = (at + DRAWN_PULSES_PIECE).min(self.drawn.len());
            read.events.clear();
            read.events
                .extend(self.drawn[at..end].iter().map(|&i| self.events.get(i)));
            read.pulses.clear();
            sizes.lengths_into(&read.events, EventLength::Pulses, &mut read.pulses);
            read.start = at;
        }
        read.pulses[at - read.start]
    }

    /// Hands out the next `n` events without listing them (a pass that only counts).
    pub(super) fn skip(&mut self, n: usize) {
        debug_assert!(n <= self.remaining());
        self.taken += n;
    }

    /// Hands out the next `n` events, appended to `out` in drawn or in stored order (put
    /// in order in `scratch`).
    pub(super) fn take(
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
            BatchOrder::Drawn => out.extend(piece.iter().map(|&i| self.events.get(i))),
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
                        out.push(self.events.get(w as u32 * 64 + word.trailing_zeros()));
                        word &= word - 1;
                    }
                }
            }
            BatchOrder::Stored => {
                let sorted = radix_sort(piece, self.events.len(), &mut scratch.sorting);
                out.extend(sorted.iter().map(|&i| self.events.get(i)));
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
pub(super) struct RadixScratch {
    keys: Vec<u32>,
    swap: Vec<u32>,
    counts: Vec<u32>,
}

/// `keys` (each below `bound`), ascending, in `scratch`: a least-significant-digit radix
/// sort, one counting pass per digit of at most [`RADIX_BITS`] bits (two for windows up to
/// 65,536 events). No comparisons and no branch on the data, where the bitmap's sparse
/// words cost a mispredicted branch each.
pub(super) fn radix_sort<'s>(
    keys: &[u32],
    bound: usize,
    scratch: &'s mut RadixScratch,
) -> &'s [u32] {
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
    to.resize(from.len(), 0);
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
    pub(super) fn new(shard_events: &[usize], config: &SamplerConfig, epoch: u64) -> EventStream {
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
        let window_events =
            (config.window_blocks.saturating_mul(config.block_events)).min(stored.total() as usize);
        EventStream {
            blocks,
            window_blocks: config.window_blocks,
            run_events: config.run_events as u64,
            shuffle: config.shuffle,
            seed: config.seed,
            epoch,
            regrouping: Regrouping::of(config),
            reads_pulses: matches!(config.batching, Batching::Pulses { .. }),
            counted: false,
            next_window: 0,
            window_start: 0,
            window: Window {
                events: WindowEvents::new(stored, config.block_events, window_events),
                drawn: Vec::new(),
                taken: 0,
                batch_ends: Vec::new(),
                pulses: None,
                drawn_pulses: DrawnPulses::default(),
            },
            announced: 0,
        }
    }

    /// The stream of a pass that only counts its batches: its windows cut into as many
    /// batches as they are otherwise, but where the count does not depend on the order
    /// events are drawn in (a token budget's), none is drawn
    /// ([`TokenCut::count`](super::regroup::TokenCut::count)).
    pub(super) fn only_counted(self) -> EventStream {
        EventStream {
            counted: true,
            ..self
        }
    }

    /// Whether its batches are only counted ([`EventStream::only_counted`]).
    pub(super) fn counted(&self) -> bool {
        self.counted
    }

    /// The epoch's rotation of the stored order (its tests' view of where blocks start).
    #[cfg(test)]
    pub(super) fn rotation(&self) -> u64 {
        self.window.events.stored.rotation
    }

    /// Announces the events of the windows up to the one after the current, not announced
    /// yet, to `sizes` (see [`EventSizes::read_ahead`]).
    pub(super) fn announce(&mut self, sizes: &dyn EventSizes) {
        let through = (self.next_window + 1).min(self.blocks.len().div_ceil(self.window_blocks));
        while self.announced < through {
            let first = self.announced * self.window_blocks;
            let last = (first + self.window_blocks).min(self.blocks.len());
            for b in &self.blocks[first..last] {
                self.window
                    .events
                    .stored
                    .pieces(b.start, b.start + b.len, |shard, events| {
                        sizes.read_ahead(shard, events)
                    });
            }
            self.announced += 1;
        }
    }

    /// The current window while it has events left, else the next one (`sizes` gives the
    /// events' lengths when batches are grouped by length); `None` at the end of the epoch.
    ///
    /// Under a pulse budget a window that lists its events reads their pulses as it opens,
    /// in its (stored) order, where asked one by one in drawn order each event's offsets
    /// were a cache miss or two: planning an epoch took 57-109 ns an event at windows 1-64,
    /// now 25-43 (1M events with the real statistics, 2-core Zen 4, `cargo bench --bench
    /// plan`). A window too big to list its events (one over the whole dataset), whose
    /// pulses would take 4 bytes an event of the window, reads them a piece of its drawn
    /// order at a time ([`Window::pulses_ahead`]).
    pub(super) fn window(&mut self, sizes: &dyn EventSizes) -> Option<&mut Window> {
        while self.window.remaining() == 0 {
            let first = self.next_window * self.window_blocks;
            if first >= self.blocks.len() {
                return None;
            }
            self.window_start += self.window.events.len() as u64;
            let mut blocks =
                self.blocks[first..(first + self.window_blocks).min(self.blocks.len())].to_vec();
            blocks.sort_unstable_by_key(|b| b.start);
            let w = &mut self.window;
            w.events.clear();
            w.drawn.clear();
            w.batch_ends.clear();
            w.taken = 0;
            let mut runs: Vec<(u32, u32)> = Vec::new();
            for b in &blocks {
                let first_event = w.events.len() as u64;
                w.events.push_block(b.start, b.len);
                if self.run_events > 1 {
                    runs.extend((0..b.len).step_by(self.run_events as usize).map(|start| {
                        let len = self.run_events.min(b.len - start);
                        ((first_event + start) as u32, len as u32)
                    }));
                }
            }
            let stream = (self.epoch << 32) ^ self.next_window as u64;
            let mut rng = Rng::stream(self.seed ^ STREAM_WINDOW, stream);
            // Each window draws from streams of its own: one not drawn leaves the next
            // windows' orders as they are.
            let counted_unordered = self.regrouping.token_cut().filter(|_| self.counted);
            if !self.shuffle || counted_unordered.is_some() {
                w.drawn.extend(0..w.events.len() as u32);
            } else if self.run_events > 1 {
                rng.shuffle(&mut runs);
                w.drawn
                    .extend(runs.iter().flat_map(|&(start, len)| start..start + len));
            } else {
                w.drawn.extend(0..w.events.len() as u32);
                rng.shuffle(&mut w.drawn);
            }
            let mut batch_order = self
                .shuffle
                .then(|| Rng::stream(self.seed ^ STREAM_LENGTH_GROUPS, stream));
            let start = self.window_start;
            match counted_unordered {
                Some(tokens) => tokens.count(w, sizes),
                None => self.regrouping.apply(w, start, sizes, batch_order.as_mut()),
            }
            w.drawn_pulses.pulses.clear();
            // Whether a window lists its events is the same for every window of the epoch.
            if self.reads_pulses && w.events.listed() {
                let pulses = w.pulses.get_or_insert_with(Vec::new);
                w.events
                    .lengths_into(sizes, EventLength::Pulses, u32::MAX, pulses);
            }
            self.next_window += 1;
        }
        Some(&mut self.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::tests::Sizes;
    use proptest::prelude::*;

    fn pulse_budget(block_events: usize, window_blocks: usize, seed: u64) -> SamplerConfig {
        SamplerConfig {
            seed,
            block_events,
            window_blocks,
            batching: Batching::Pulses {
                max_pulses: 1000,
                max_events: None,
                pulse_cap: None,
            },
            ..SamplerConfig::default()
        }
    }

    proptest! {
        /// Under a pulse budget each drawn event's pulses are the ones the sizes give, asked
        /// in any order, whether the window read each event's as it opened (it lists its
        /// events) or reads them a piece of the drawn order at a time (it is too big to).
        #[test]
        fn a_windows_pulses_are_each_drawn_events_listed_or_not(
            shards in proptest::collection::vec(0usize..700, 1..6),
            block in 1usize..40, window in 1usize..30, seed in any::<u64>(), listed: bool,
            steps in proptest::collection::vec(1usize..300, 1..8),
            asks in proptest::collection::vec(any::<usize>(), 1..40),
        ) {
            let sizes = Sizes(shards);
            let config = pulse_budget(block, window, seed);
            let mut stream = EventStream::new(&sizes.0, &config, 3);
            if !listed {
                let stored = stream.window.events.stored.clone();
                stream.window.events = WindowEvents::listing(stored, block, false);
            }
            let mut windows = 0;
            while let Some(w) = stream.window(&sizes) {
                prop_assert_eq!(w.pulses.is_some(), listed);
                windows += 1;
                let mut step = steps.iter().cycle();
                while w.remaining() > 0 {
                    for &ask in &asks {
                        let ahead = ask % w.remaining();
                        prop_assert_eq!(w.pulses_ahead(ahead, &sizes), sizes.pulses(w.peek(ahead)));
                    }
                    for ahead in 0..w.remaining() {
                        prop_assert_eq!(w.pulses_ahead(ahead, &sizes), sizes.pulses(w.peek(ahead)));
                    }
                    w.skip((*step.next().unwrap()).min(w.remaining()));
                }
            }
            prop_assert_eq!(windows, sizes.0.iter().sum::<usize>().div_ceil(block).div_ceil(window));
        }
    }

    /// A window too big to list its events holds no pulses of its own (they would take 4
    /// bytes an event of a window over the whole dataset), only a piece of the drawn
    /// order's.
    #[test]
    fn a_window_too_big_to_list_holds_a_piece_of_its_drawn_pulses() {
        let sizes = Sizes(vec![150_000, 150_000]);
        let config = pulse_budget(1000, 300, 5);
        let mut stream = EventStream::new(&sizes.0, &config, 0);
        let w = stream.window(&sizes).unwrap();
        assert!(!w.events.listed());
        assert!(w.pulses.is_none());
        assert_eq!(w.remaining(), 300_000);
        for ahead in [0, 1, 77_777, 299_999, 5] {
            assert_eq!(w.pulses_ahead(ahead, &sizes), sizes.pulses(w.peek(ahead)));
            assert!(w.drawn_pulses.pulses.len() <= DRAWN_PULSES_PIECE);
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
}
