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
    let lengths = drawn_lengths(window, range.clone(), lengths, sizes);
    let grouped = &mut window.drawn[range];
    let by_length = stable_order_by(&lengths);
    let mut classes: Vec<usize> = (0..whole.count).collect();
    if let Some(rng) = batch_order {
        rng.shuffle(&mut classes);
    }
    let drawn = grouped.to_vec();
    for (batch, &class) in grouped.chunks_exact_mut(n).zip(&classes) {
        for (slot, &position) in batch.iter_mut().zip(&by_length[class * n..(class + 1) * n]) {
            *slot = drawn[position as usize];
        }
    }
}

/// The capped lengths of the events at drawn positions `range` of `window`, in drawn order
/// (as `u32`: a shard's offsets are 32-bit, and a window over a whole dataset holds one per
/// event).
fn drawn_lengths(
    window: &Window,
    range: std::ops::Range<usize>,
    (length, cap): CappedLength,
    sizes: &dyn EventSizes,
) -> Vec<u32> {
    // Asked in the window's order, which is stored order: its offsets are read
    // sequentially, where asked in drawn order they were read at random (25 ns an event).
    let event_lengths = window.events.lengths(sizes, length);
    let cap = cap.min(u32::MAX as usize) as u32;
    window.drawn[range]
        .iter()
        .map(|&i| event_lengths[i as usize].min(cap))
        .collect()
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
        let count = window.drawn.len();
        let lengths_drawn = drawn_lengths(window, 0..count, self.lengths, sizes);
        let sorted = stable_order_by(&lengths_drawn);
        let mut batches = token_batches(count, self.budget, self.lengths.1, |k| {
            lengths_drawn[sorted[k] as usize] as usize
        });
        if let Some(rng) = batch_order {
            rng.shuffle(&mut batches);
        }
        let drawn = window.drawn.clone();
        window.drawn.clear();
        for batch in batches {
            let events = sorted[batch]
                .iter()
                .map(|&position| drawn[position as usize]);
            window.drawn.extend(events);
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
        let count = window.drawn.len();
        let mut lengths = drawn_lengths(window, 0..count, self.lengths, sizes);
        let (budget, cap) = (self.budget, self.lengths.1);
        let batches = match length_starts(&lengths) {
            Some(starts) => token_batches(count, budget, cap, |k| nth_shortest(&starts, k)),
            None => {
                lengths.sort_unstable();
                token_batches(count, budget, cap, |k| lengths[k] as usize)
            }
        };
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

/// The positions of `lengths`, ordered by length, ties by position: a stable counting
/// sort (one pass counting each length, one placing each position) where the lengths span
/// at most [`COUNTED_LENGTHS`] or the events' count, else a comparison sort (long events
/// uncapped).
fn stable_order_by(lengths: &[u32]) -> Vec<u32> {
    let Some(mut starts) = length_starts(lengths) else {
        let mut positions: Vec<u32> = (0..lengths.len() as u32).collect();
        positions.sort_by_key(|&p| lengths[p as usize]);
        return positions;
    };
    let mut positions = vec![0; lengths.len()];
    for (position, &length) in lengths.iter().enumerate() {
        let slot = &mut starts[length as usize];
        positions[*slot as usize] = position as u32;
        *slot += 1;
    }
    positions
}

/// Lengths up to this many are always counted, whatever the events' count (256 KiB of
/// counts).
const COUNTED_LENGTHS: usize = 1 << 16;

/// Per length from 0 to the longest of `lengths`, how many are shorter: where its events
/// start when sorted by length. `None` when the longest is past both [`COUNTED_LENGTHS`]
/// and the count of `lengths` (the counts would outweigh the events).
fn length_starts(lengths: &[u32]) -> Option<Vec<u32>> {
    let longest = lengths.iter().copied().max().unwrap_or(0) as usize;
    if longest > COUNTED_LENGTHS.max(lengths.len()) {
        return None;
    }
    let mut starts = vec![0u32; longest + 1];
    for &length in lengths {
        starts[length as usize] += 1;
    }
    let mut sum = 0;
    for start in &mut starts {
        (*start, sum) = (sum, sum + *start);
    }
    Some(starts)
}

/// The length of the `k`th shortest event, from where each length's events start when
/// sorted ([`length_starts`]): the greatest length whose events start at or before `k`.
fn nth_shortest(starts: &[u32], k: usize) -> usize {
    starts.partition_point(|&start| start as usize <= k) - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Lengths short enough to be counted, or some past [`COUNTED_LENGTHS`].
    fn lengths() -> impl Strategy<Value = Vec<u32>> {
        prop_oneof![
            proptest::collection::vec(0u32..300, 0..400),
            proptest::collection::vec(0u32..3_000_000, 0..50),
        ]
    }

    proptest! {
        /// Both ways of sorting (counted, or compared for long events) give the stable
        /// order, and the `k`th shortest read from the counts is the sorted lengths' `k`th.
        #[test]
        fn lengths_are_ordered_stably_and_read_back_in_order(lengths in lengths()) {
            let mut expected: Vec<u32> = (0..lengths.len() as u32).collect();
            expected.sort_by_key(|&p| lengths[p as usize]);
            prop_assert_eq!(stable_order_by(&lengths), expected);
            let longest = lengths.iter().copied().max().unwrap_or(0) as usize;
            let starts = length_starts(&lengths);
            prop_assert_eq!(starts.is_some(), longest <= COUNTED_LENGTHS.max(lengths.len()));
            if let Some(starts) = starts {
                let mut sorted = lengths.clone();
                sorted.sort_unstable();
                for (k, &length) in sorted.iter().enumerate() {
                    prop_assert_eq!(nth_shortest(&starts, k), length as usize, "k {}", k);
                }
            }
        }
    }

    /// Lengths past [`COUNTED_LENGTHS`] are counted where the events outnumber them, and
    /// compared where they do not.
    #[test]
    fn long_lengths_are_counted_only_among_as_many_events() {
        let long = COUNTED_LENGTHS as u32 + 10;
        assert!(length_starts(&[long, 3]).is_none());
        let many: Vec<u32> = (0..=long).rev().collect();
        let starts = length_starts(&many).expect("as many events as lengths");
        assert_eq!(starts.len(), long as usize + 1);
        assert_eq!(nth_shortest(&starts, 0), 0);
        assert_eq!(nth_shortest(&starts, long as usize), long as usize);
    }
}
