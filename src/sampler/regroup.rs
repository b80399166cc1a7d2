//! What a window's drawn order becomes before it is handed out: batches grouped by length
//! (its whole batches sorted by event length and put in a drawn order), or cut by a budget
//! of padded tokens (all its events sorted by length and cut from the longest down).

use super::stream::{radix_sort_owned, Window};
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
    /// All of it cut into batches by a token budget ([`cut_by_tokens`]), sorted by
    /// `lengths` (uncapped pulse counts without a grouping: a budget the sampler's
    /// configuration check refuses, still a partition of the window).
    Tokens {
        budget: TokenBudget,
        lengths: CappedLength,
    },
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
            ) => Regrouping::Tokens {
                budget: TokenBudget {
                    max_tokens,
                    max_events,
                    multiple: pad_to_multiple_of.unwrap_or(1).max(1),
                },
                lengths: lengths.unwrap_or((EventLength::Pulses, usize::MAX)),
            },
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
            Regrouping::Tokens { budget, lengths } => {
                cut_by_tokens(window, budget, lengths, sizes, batch_order)
            }
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

/// Cuts all of `window`'s drawn order into batches by `budget`: sorted by `lengths` (ties
/// in drawn order), then cut from the longest events down, each batch as many events as
/// its longest length (rounded up to `budget.multiple`, at most the cap) allows within
/// `budget.max_tokens` (one when it alone is longer) and `budget.max_events`. So the
/// window's remainder, the one batch that holds less, is of its shortest events, not one
/// or two long ones (a noisy step, and a BatchNorm that fails on one); and a remainder of
/// less than half the batch before it shares that batch's events evenly (an event cap
/// would otherwise leave a few short events alone). The batches are put in the order
/// `batch_order` shuffles them into (shortest first without one), and their ends recorded
/// in [`Window::batch_ends`].
fn cut_by_tokens(
    window: &mut Window,
    budget: TokenBudget,
    lengths: CappedLength,
    sizes: &dyn EventSizes,
    batch_order: Option<&mut Rng>,
) {
    let count = window.drawn.len();
    let lengths_drawn = drawn_lengths(window, 0..count, lengths, sizes);
    let sorted = stable_order_by(&lengths_drawn);
    // Each batch as a range of `sorted`, longest first.
    let capacity = |longest: usize| {
        let padded = longest
            .checked_next_multiple_of(budget.multiple)
            .map_or(lengths.1, |padded| padded.min(lengths.1));
        let fit = budget.max_tokens.checked_div(padded).unwrap_or(usize::MAX);
        fit.clamp(1, budget.max_events.unwrap_or(usize::MAX))
    };
    let longest_of = |end: usize| lengths_drawn[sorted[end - 1] as usize] as usize;
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

/// The positions of `lengths`, ordered by length, ties by position (a stable sort): by
/// [`radix_sort_owned`] of `length * count + position` where that fits 32 bits (a cap of
/// 256 over a window of 16 million events), its keys then turned into positions in place,
/// else by a comparison sort (`cap` None over long events).
fn stable_order_by(lengths: &[u32]) -> Vec<u32> {
    let count = lengths.len();
    let longest = lengths.iter().copied().max().unwrap_or(0) as usize;
    match (longest + 1).checked_mul(count) {
        Some(bound) if bound <= u32::MAX as usize + 1 => {
            let keys: Vec<u32> = (0..count)
                .map(|p| (lengths[p] as usize * count + p) as u32)
                .collect();
            let mut positions = radix_sort_owned(keys, bound);
            for key in &mut positions {
                *key %= count as u32;
            }
            positions
        }
        _ => {
            let mut positions: Vec<u32> = (0..count as u32).collect();
            positions.sort_by_key(|&p| lengths[p as usize]);
            positions
        }
    }
}
