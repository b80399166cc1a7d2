//! What a window's drawn order becomes before it is handed out: batches grouped by length
//! (its whole batches sorted by event length and put in a drawn order), or cut by a budget
//! of padded tokens (all its events sorted by length and cut from the longest down).

use super::stream::Window;
use super::{Batching, EventLength, EventSizes, SamplerConfig};
use crate::rng::Rng;

/// What is done to a window's drawn order before it is handed out.
#[derive(Debug, Clone, Copy)]
pub(super) enum Regrouping {
    /// Nothing: handed out as drawn.
    AsDrawn,
    /// Its whole batches of `batch_events` regrouped by `lengths` ([`group_by_length`]).
    WholeBatches {
        batch_events: usize,
        lengths: CappedLength,
    },
    /// All of it cut into batches by a token budget ([`TokenCut`]).
    Tokens(TokenCut),
}

/// What an event's length counts, and the cap above which lengths count as the cap
/// (`usize::MAX` when none).
pub(super) type CappedLength = (EventLength, usize);

/// `max_tokens`, `max_events` and `pad_to_multiple_of` of [`Batching::Tokens`].
#[derive(Debug, Clone, Copy)]
pub(super) struct TokenBudget {
    max_tokens: usize,
    max_events: Option<usize>,
    /// 1 when not rounded.
    multiple: usize,
}

impl Regrouping {
    /// What `config`'s batching and length grouping do to each window.
    pub(super) fn of(config: &SamplerConfig) -> Regrouping {
        let lengths = config
            .group_by_length
            .length_and_cap()
            .map(|(length, cap)| (length, cap.unwrap_or(usize::MAX)));
        match (config.batching, lengths) {
            (Batching::Events(batch_events), Some(lengths)) => Regrouping::WholeBatches {
                batch_events,
                lengths,
            },
            (
                Batching::Tokens {
                    max_tokens,
                    max_events,
                    pad_to_multiple_of,
                },
                lengths,
            ) => Regrouping::Tokens(TokenCut {
                budget: TokenBudget {
                    max_tokens,
                    max_events,
                    multiple: pad_to_multiple_of.unwrap_or(1).max(1),
                },
                lengths: lengths.unwrap_or((EventLength::Pulses, usize::MAX)),
            }),
            _ => Regrouping::AsDrawn,
        }
    }

    /// Regroups `window`, whose first event is at global position `start`, its lengths from
    /// `sizes`, its batches put in the order `batch_order` shuffles them into (shortest first
    /// without one).
    pub(super) fn apply(
        self,
        window: &mut Window,
        start: u64,
        sizes: &dyn EventSizes,
        batch_order: Option<&mut Rng>,
    ) {
        match self {
            Regrouping::AsDrawn => {}
            Regrouping::WholeBatches {
                batch_events,
                lengths,
            } => {
                let whole = WholeBatches::of(start, window.events.len(), batch_events);
                group_by_length(window, whole, lengths, sizes, batch_order);
            }
            Regrouping::Tokens(tokens) => tokens.cut(window, sizes, batch_order),
        }
    }

    /// The token budget a window is cut by, if any: its batches, and so their count,
    /// follow from its events' lengths whatever order they are drawn in
    /// ([`TokenCut::count`]).
    pub(super) fn token_cut(self) -> Option<TokenCut> {
        match self {
            Regrouping::Tokens(tokens) => Some(tokens),
            Regrouping::AsDrawn | Regrouping::WholeBatches { .. } => None,
        }
    }
}

/// The batches of `batch_events` events that lie whole inside a window: from its drawn
/// position `first`, `count` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WholeBatches {
    first: usize,
    count: usize,
    batch_events: usize,
}

impl WholeBatches {
    /// Those of a window of `events` events starting at global position `start`, the epoch
    /// cut into batches of `batch_events` from position 0.
    fn of(start: u64, events: usize, batch_events: usize) -> WholeBatches {
        let n = batch_events as u64;
        // The rest of a batch begun in the window before (none when `start` is a boundary).
        let first = ((n - start % n) % n).min(events as u64) as usize;
        WholeBatches {
            first,
            count: (events - first) / batch_events,
            batch_events,
        }
    }
}

/// Regroups `window`'s drawn order over its `whole` batches: their events sorted by
/// `length` (from `sizes`, counts above `cap` as `cap`; ties in drawn order), cut into
/// batches, and those put in the order `batch_order` shuffles them into (shortest first
/// without one).
fn group_by_length(
    window: &mut Window,
    whole: WholeBatches,
    lengths: CappedLength,
    sizes: &dyn EventSizes,
    batch_order: Option<&mut Rng>,
) {
    let n = whole.batch_events;
    let range = whole.first..whole.first + whole.count * n;
    let lengths = window_lengths(window, lengths, sizes);
    let (before, rest) = window.drawn.split_at_mut(range.start);
    let (grouped, after) = rest.split_at_mut(range.len());
    let (by_length, _) = sort_by_length(grouped, [&before[..], &after[..]], &lengths);
    let mut classes: Vec<usize> = (0..whole.count).collect();
    if let Some(rng) = batch_order {
        rng.shuffle(&mut classes);
    }
    for (batch, &class) in grouped.chunks_exact_mut(n).zip(&classes) {
        batch.copy_from_slice(&by_length[class * n..(class + 1) * n]);
    }
}

/// The capped lengths of `window`'s events, in window order (as `u32`: a shard's offsets
/// are 32-bit, and a window over a whole dataset holds one per event). Asked in the
/// window's order, which is stored order, their offsets are read sequentially, where asked
/// in drawn order they were read at random (25 ns an event).
fn window_lengths(
    window: &Window,
    (length, cap): CappedLength,
    sizes: &dyn EventSizes,
) -> Vec<u32> {
    let cap = cap.min(u32::MAX as usize) as u32;
    window.events.lengths(sizes, length, cap)
}

/// A window cut into batches by a token budget: all of its drawn order sorted by
/// `lengths` (uncapped pulse counts without a grouping: a budget the sampler's
/// configuration check refuses, still a partition of the window), then cut from the
/// longest events down ([`token_batches`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct TokenCut {
    budget: TokenBudget,
    lengths: CappedLength,
}

impl TokenCut {
    /// Cuts `window`'s drawn order (ties in drawn order), its batches put in the order
    /// `batch_order` shuffles them into (shortest first without one), and their ends
    /// recorded in [`Window::batch_ends`].
    fn cut(self, window: &mut Window, sizes: &dyn EventSizes, batch_order: Option<&mut Rng>) {
        let lengths = window_lengths(window, self.lengths, sizes);
        let (by_length, sorted) = sort_by_length(&window.drawn, [], &lengths);
        let mut batches = token_batches(by_length.len(), self.budget, self.lengths.1, |k| {
            sorted.nth(k)
        });
        if let Some(rng) = batch_order {
            rng.shuffle(&mut batches);
        }
        window.drawn.clear();
        for batch in batches {
            window.drawn.extend_from_slice(&by_length[batch]);
            window.batch_ends.push(window.drawn.len() as u32);
        }
    }

    /// As [`TokenCut::cut`] for a pass that only counts the batches: the same batches'
    /// ends, from the count of events of each length, where drawing and sorting the
    /// window's order made a count at window 16 take 34-39 ns an event, now 19-23 (1M
    /// events with the real statistics, 2-core Zen 4, `cargo bench --bench plan`);
    /// `window`'s order (drawn or not) left as it is, and the batches in the order they
    /// are cut.
    pub(super) fn count(self, window: &mut Window, sizes: &dyn EventSizes) {
        let sorted = SortedLengths::of(&window_lengths(window, self.lengths, sizes));
        let batches = token_batches(window.drawn.len(), self.budget, self.lengths.1, |k| {
            sorted.nth(k)
        });
        window
            .batch_ends
            .extend(batches.iter().map(|batch| batch.end as u32));
    }
}

/// The batches a token budget cuts `count` events sorted by length into, as ranges of that
/// order, shortest first; `length_at(k)` is the length of the `k`th shortest, at most
/// `cap`. Cut from the longest events down, each batch as many events as its longest
/// length (rounded up to `budget.multiple`, at most `cap`) allows within
/// `budget.max_tokens` (one when it alone is longer) and `budget.max_events`. So the
/// window's remainder, the one batch that holds less, is of its shortest events, not one
/// or two long ones (a noisy step, and a BatchNorm that fails on one); and a remainder of
/// less than half the batch before it shares that batch's events evenly (an event cap
/// would otherwise leave a few short events alone).
fn token_batches(
    count: usize,
    budget: TokenBudget,
    cap: usize,
    length_at: impl Fn(usize) -> usize,
) -> Vec<std::ops::Range<usize>> {
    let capacity = |longest: usize| {
        let padded = longest
            .checked_next_multiple_of(budget.multiple)
            .map_or(cap, |padded| padded.min(cap));
        let fit = budget.max_tokens.checked_div(padded).unwrap_or(usize::MAX);
        fit.clamp(1, budget.max_events.unwrap_or(usize::MAX))
    };
    let longest_of = |end: usize| length_at(end - 1);
    let mut batches: Vec<std::ops::Range<usize>> = Vec::new();
    let mut end = count;
    while end > 0 {
        let mut take = capacity(longest_of(end)).min(end);
        let rest = end - take;
        // The rest would be the window's last batch and hold less than half of this one's
        // events: the two share them (the shorter half last; both still fit).
        if rest > 0 && rest <= capacity(longest_of(rest)) && rest < take / 2 {
            take = end - end / 2;
        }
        batches.push(end - take..end);
        end -= take;
    }
    batches.reverse();
    batches
}

/// `entries` (indexes of a window's events: its drawn order, or a part of it whose other
/// parts are `left_out`) ordered by their events' `lengths` (the window's, in window
/// order), ties in the order given; and their lengths in that order. A counting sort, each
/// entry put in the next place of its length (stable by construction, its length read
/// once, [`PLACE_AHEAD`] entries after its prefetch); lengths past what so many are
/// counted by ([`counted_lengths`]) are placed together last and sorted there by
/// comparison (stably: long events, uncapped, a few a window).
fn sort_by_length<const PARTS: usize>(
    entries: &[u32],
    left_out: [&[u32]; PARTS],
    lengths: &[u32],
) -> (Vec<u32>, SortedLengths) {
    let (mut counts, long) = length_counts(lengths);
    let place = |entry: u32| (lengths[entry as usize] as usize).min(long);
    for &entry in left_out.iter().copied().flatten() {
        counts[place(entry)] -= 1;
    }
    let starts = into_starts(counts);
    let mut next = starts.clone();
    let mut sorted = vec![0; entries.len()];
    for (i, &entry) in entries.iter().enumerate() {
        if let Some(&ahead) = entries.get(i + PLACE_AHEAD) {
            crate::prefetch::prefetch(&lengths[ahead as usize..ahead as usize + 1]);
        }
        let slot = &mut next[place(entry)];
        sorted[*slot as usize] = entry;
        *slot += 1;
    }
    let longest = &mut sorted[starts[long] as usize..];
    longest.sort_by_key(|&entry| lengths[entry as usize]);
    let tail = longest.iter().map(|&entry| lengths[entry as usize]);
    let sorted_lengths = SortedLengths {
        tail: tail.collect(),
        starts,
    };
    (sorted, sorted_lengths)
}

/// How far ahead of the entry it places [`sort_by_length`] prefetches an entry's length:
/// over a whole-dataset window of 32M events the entries' lengths are read at random from
/// 128 MB, and a token budget's first batch took 1.56-1.85 s without it, 1.30-1.39 with
/// it (synthetic sizes, 2-core Zen 4; docs/results.md).
const PLACE_AHEAD: usize = 32;

/// Lengths in ascending order: those below a bound counted (per length, how many are
/// shorter: where its events start), the others listed after them.
struct SortedLengths {
    /// Per length from 0 to the bound, how many are shorter (the bound's: all that are
    /// counted).
    starts: Vec<u32>,
    /// The lengths from the bound on, ascending.
    tail: Vec<u32>,
}

impl SortedLengths {
    /// `lengths` in ascending order.
    fn of(lengths: &[u32]) -> SortedLengths {
        let (counts, long) = length_counts(lengths);
        let mut tail: Vec<u32> = lengths
            .iter()
            .copied()
            .filter(|&length| length as usize >= long)
            .collect();
        tail.sort_unstable();
        SortedLengths {
            starts: into_starts(counts),
            tail,
        }
    }

    /// The `k`th shortest length: the greatest counted length whose events start at or
    /// before `k`, or one of the tail.
    fn nth(&self, k: usize) -> usize {
        let counted = *self.starts.last().unwrap_or(&0) as usize;
        match k.checked_sub(counted) {
            Some(in_tail) => self.tail[in_tail] as usize,
            None => self.starts.partition_point(|&start| start as usize <= k) - 1,
        }
    }
}

/// Lengths up to this many are always counted, whatever the events' count (4 KiB of
/// counts).
const COUNTED_LENGTHS: usize = 1 << 10;

/// Lengths past this many are never counted (4 MiB of counts).
const COUNTED_LENGTHS_MOST: usize = 1 << 20;

/// Lengths up to this many times the events' count are counted (between
/// [`COUNTED_LENGTHS`] and [`COUNTED_LENGTHS_MOST`]): counting costs about a step a length
/// and one an event, where comparing costs tens an event.
const COUNTED_LENGTHS_PER_EVENT: usize = 8;

/// The lengths below which `lengths` are counted one by one: up to the longest, at most
/// [`COUNTED_LENGTHS_PER_EVENT`] times their count; the longer ones are counted together,
/// as this one.
fn counted_lengths(lengths: &[u32]) -> usize {
    let longest = lengths.iter().copied().max().unwrap_or(0) as usize;
    let most = (lengths.len().saturating_mul(COUNTED_LENGTHS_PER_EVENT))
        .clamp(COUNTED_LENGTHS, COUNTED_LENGTHS_MOST);
    (longest + 1).min(most)
}

/// Per length from 0 to the bound [`counted_lengths`] sets for `lengths`, how many have it
/// (the bound's place counting every length from it on); and the bound.
fn length_counts(lengths: &[u32]) -> (Vec<u32>, usize) {
    let long = counted_lengths(lengths);
    let mut counts = vec![0u32; long + 1];
    for &length in lengths {
        counts[(length as usize).min(long)] += 1;
    }
    (counts, long)
}

/// `counts` turned into where each length's events start: the counts before it.
fn into_starts(mut counts: Vec<u32>) -> Vec<u32> {
    let mut sum = 0;
    for count in &mut counts {
        (*count, sum) = (sum, sum + *count);
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Lengths short enough to be counted, some past what so few are counted by, or
    /// mostly short with a few long.
    fn lengths() -> impl Strategy<Value = Vec<u32>> {
        prop_oneof![
            proptest::collection::vec(0u32..300, 1..400),
            proptest::collection::vec(0u32..3_000_000, 1..50),
            proptest::collection::vec(prop_oneof![9 => 0u32..40, 1 => 2_000u32..200_000], 1..600),
        ]
    }

    proptest! {
        /// Entries, the whole of a drawn order or a part of it, come out stably sorted by
        /// length, counted or (the longest) compared, and the `k`th shortest length read
        /// back is the sorted lengths' `k`th.
        #[test]
        fn entries_are_sorted_stably_by_length_and_their_lengths_read_back_in_order(
            lengths in lengths(), seed in any::<u64>(), cuts in (any::<usize>(), any::<usize>()),
        ) {
            let mut drawn: Vec<u32> = (0..lengths.len() as u32).collect();
            crate::rng::Rng::new(seed).shuffle(&mut drawn);
            let (a, b) = (cuts.0 % (drawn.len() + 1), cuts.1 % (drawn.len() + 1));
            let (first, end) = (a.min(b), a.max(b));
            let part = &drawn[first..end];
            let mut expected = part.to_vec();
            expected.sort_by_key(|&entry| lengths[entry as usize]);
            let (sorted, sorted_lengths) =
                sort_by_length(part, [&drawn[..first], &drawn[end..]], &lengths);
            prop_assert_eq!(&sorted, &expected);
            for (k, &entry) in expected.iter().enumerate() {
                prop_assert_eq!(sorted_lengths.nth(k), lengths[entry as usize] as usize, "k {}", k);
            }
            let whole = SortedLengths::of(&lengths);
            let mut ascending = lengths.clone();
            ascending.sort_unstable();
            for (k, &length) in ascending.iter().enumerate() {
                prop_assert_eq!(whole.nth(k), length as usize, "k {}", k);
            }
            let long = counted_lengths(&lengths);
            prop_assert_eq!(whole.tail.len(), lengths.iter().filter(|&&l| l as usize >= long).count());
        }
    }

    /// Lengths are counted one by one up to the longest, or eight times the events'
    /// count, between 2^10 and 2^20; the longer ones together.
    #[test]
    fn lengths_are_counted_up_to_eight_times_the_events_within_bounds() {
        assert_eq!(counted_lengths(&[3, 1]), 4, "up to the longest");
        assert_eq!(counted_lengths(&[5_000, 1]), COUNTED_LENGTHS);
        let mut many: Vec<u32> = (0..2000).collect();
        many[7] = 100_000;
        assert_eq!(counted_lengths(&many), 16_000, "8 times 2000");
        let mut most = vec![0u32; COUNTED_LENGTHS_MOST];
        most[0] = u32::MAX;
        assert_eq!(
            counted_lengths(&most),
            COUNTED_LENGTHS_MOST,
            "never past 2^20"
        );
        let sorted = SortedLengths::of(&[3, 1, 3, 0, 9_000]);
        assert_eq!(sorted.starts.len(), COUNTED_LENGTHS + 1);
        assert_eq!(sorted.starts[..5], [0, 1, 2, 2, 4]);
        assert_eq!(
            sorted.starts[COUNTED_LENGTHS], 4,
            "all but the longest counted"
        );
        assert_eq!(sorted.tail, [9_000]);
        assert_eq!(sorted.nth(4), 9_000);
    }
}
