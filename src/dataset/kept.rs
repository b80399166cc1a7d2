//! Which events of one shard a view keeps: the kept events' indexes, or the left-out ones'
//! when those are far fewer. The training part of a small validation split keeps nearly
//! every event of every shard, so it lists the few it leaves out: a 1% split of the Kaggle
//! set holds about 0.14 bytes per event over both views, where listing the kept events of
//! both took 4 (528 MB in every process that split 132M events).

use crate::format::pod::as_bytes;

/// A shard's kept events are held as the left-out ones when these are at most a 32nd as
/// many (about 3% of the shard left out). Finding a kept event from the left-out ones costs
/// more the denser they are: a pulse budget asks each event of a window alone, in drawn
/// order, and planned a window of 16 blocks at 21-22 ns an event listed, 24 listing the
/// left-out 1%, 32 listing the left-out 10% (320k events with the real statistics). A
/// validation split of 1-3% keeps its training part in about 0.1 byte an event; a larger
/// split lists both parts, as before.
const LISTED_PER_LEFT_OUT: usize = 32;

/// Every this many kept events, an all-but form notes how many left-out events come before:
/// a kept event asked alone (as a pulse budget asks each event of a window in drawn order)
/// is then found a few steps from its sample, where a binary search over a shard's
/// left-out events took 38-46 ns an event to plan a window of 16 blocks against 21 listed
/// (320k events with the real statistics, the 99% and 90% views of a split). 0.06 bytes a
/// kept event.
const SAMPLED: usize = 64;

/// The events of one shard that a view keeps, as ascending shard indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptEvents {
    /// The shard's events, kept or not.
    shard_events: u32,
    form: Form,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Form {
    /// The kept events' indexes, ascending.
    Listed(Vec<u32>),
    /// The left-out events.
    AllBut {
        /// For each left-out event, in ascending order, its index less its rank among the
        /// left-out ones: how many kept events come before it (so non-decreasing). The
        /// view's `i`-th event is `i` plus how many of these are at most `i`.
        kept_before: Vec<u32>,
        /// For every [`SAMPLED`]-th kept event, how many left-out events come before it:
        /// where the count for any kept event starts, a few steps short of it.
        samples: Vec<u32>,
    },
}

impl KeptEvents {
    /// Of a shard of `shard_events` events, those whose bit is set in `marks` (bit `i %
    /// 64` of word `i / 64` for event `i`; bits past `shard_events` clear): listed, unless
    /// they are at least [`LISTED_PER_LEFT_OUT`] times as many as the left-out ones, which
    /// are listed then.
    pub(crate) fn marked(shard_events: u32, marks: &[u64]) -> KeptEvents {
        let kept: usize = marks.iter().map(|w| w.count_ones() as usize).sum();
        let listed = (shard_events as usize - kept) * LISTED_PER_LEFT_OUT > kept;
        KeptEvents::marked_in(shard_events, marks, kept, listed)
    }

    /// As [`KeptEvents::marked`], of `kept` marked events, listed or not as `listed` says.
    fn marked_in(shard_events: u32, marks: &[u64], kept: usize, listed: bool) -> KeptEvents {
        debug_assert_eq!(marks.len(), (shard_events as usize).div_ceil(64));
        let (count, flip) = match listed {
            true => (kept, 0),
            false => (shard_events as usize - kept, u64::MAX),
        };
        // The indexes of the set bits (listed) or of the clear ones (all but).
        let mut indexes = Vec::with_capacity(count);
        for (w, &word) in marks.iter().enumerate() {
            let mut bits = word ^ flip;
            let past_the_end = (w + 1) * 64 > shard_events as usize;
            if !listed && past_the_end {
                bits &= u64::MAX >> ((w + 1) * 64 - shard_events as usize);
            }
            while bits != 0 {
                indexes.push(w as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        let form = match listed {
            true => Form::Listed(indexes),
            false => {
                for (rank, index) in indexes.iter_mut().enumerate() {
                    *index -= rank as u32;
                }
                let kept_before = indexes;
                let samples = (0..kept)
                    .step_by(SAMPLED)
                    .map(|i| kept_before.partition_point(|&k| k as usize <= i) as u32)
                    .collect();
                Form::AllBut {
                    kept_before,
                    samples,
                }
            }
        };
        KeptEvents { shard_events, form }
    }

    /// How many events are kept.
    pub fn len(&self) -> usize {
        match &self.form {
            Form::Listed(kept) => kept.len(),
            Form::AllBut { kept_before, .. } => self.shard_events as usize - kept_before.len(),
        }
    }

    /// Whether no event is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard index of the `i`-th kept event (`i < len()`).
    pub fn get(&self, i: u32) -> u32 {
        Walk::from(&self.form, i).step()
    }

    /// The shard indexes of the kept events from the `first`-th on, ascending: one search,
    /// then a step each (what locating a run of a block's events costs).
    pub fn iter_from(&self, first: u32) -> impl Iterator<Item = u32> + '_ {
        let mut walk = Walk::from(&self.form, first);
        (first as usize..self.len()).map(move |_| walk.step())
    }

    /// Sets each of `indexes` to the shard index of the kept events from the `first`-th
    /// on, in turn (at most `len() - first` of them): one search, then a step each.
    pub fn locate_run<'i>(&self, first: u32, indexes: impl Iterator<Item = &'i mut u32>) {
        let mut walk = Walk::from(&self.form, first);
        for index in indexes.take(self.len().saturating_sub(first as usize)) {
            *index = walk.step();
        }
    }

    /// The kept events' shard indexes, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter_from(0)
    }

    /// Feeds `hash` what identifies these events: their count as 8 bytes, then their
    /// indexes as 4 bytes each (little-endian machines: native order), whatever the form.
    pub(crate) fn digest_into(&self, hash: &mut xxhash_rust::xxh3::Xxh3) {
        hash.update(&(self.len() as u64).to_le_bytes());
        match &self.form {
            Form::Listed(kept) => hash.update(as_bytes(kept)),
            Form::AllBut { .. } => {
                let mut chunk = Vec::with_capacity(CHUNK);
                let mut kept = self.iter();
                loop {
                    chunk.clear();
                    chunk.extend(kept.by_ref().take(CHUNK));
                    if chunk.is_empty() {
                        break;
                    }
                    hash.update(as_bytes(&chunk));
                }
            }
        }
    }

    /// Heap bytes held.
    pub fn held_bytes(&self) -> usize {
        let held = match &self.form {
            Form::Listed(kept) => kept.capacity(),
            Form::AllBut {
                kept_before,
                samples,
            } => kept_before.capacity() + samples.capacity(),
        };
        held * size_of::<u32>()
    }
}

/// A walk over a shard's kept events, from one of them on.
struct Walk<'k> {
    form: &'k Form,
    /// Listed: the place of the next kept event in the list. All but: how many left-out
    /// events come before `next`.
    at: usize,
    /// All but: the shard index the next kept event is at or after.
    next: u32,
}

impl<'k> Walk<'k> {
    /// At the `first`-th kept event: for the all-but form, the left-out events with at
    /// most `first` kept events before them come before it.
    fn from(form: &'k Form, first: u32) -> Walk<'k> {
        let at = match form {
            Form::Listed(_) => first as usize,
            Form::AllBut {
                kept_before,
                samples,
            } => {
                let mut at = samples
                    .get(first as usize / SAMPLED)
                    .map_or(kept_before.len(), |&s| s as usize);
                while kept_before.get(at).is_some_and(|&k| k <= first) {
                    at += 1;
                }
                at
            }
        };
        Walk {
            form,
            at,
            next: first + at as u32,
        }
    }

    /// The next kept event's shard index (there must be one).
    fn step(&mut self) -> u32 {
        match self.form {
            Form::Listed(kept) => {
                self.at += 1;
                kept[self.at - 1]
            }
            Form::AllBut { kept_before, .. } => {
                // Over the left-out events here: the next has `next - at` kept before it.
                while kept_before.get(self.at) == Some(&(self.next - self.at as u32)) {
                    (self.next, self.at) = (self.next + 1, self.at + 1);
                }
                self.next += 1;
                self.next - 1
            }
        }
    }
}

/// Indexes hashed at once when a left-out list is expanded for a digest.
const CHUNK: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subset of a shard of `n` events, each a bit of `mask`.
    fn subsets(n: u32) -> impl Iterator<Item = Vec<u32>> {
        (0u32..1 << n).map(move |mask| (0..n).filter(|i| mask >> i & 1 == 1).collect())
    }

    /// The marks of `kept` of a shard of `n` events.
    fn marks(n: u32, kept: &[u32]) -> Vec<u64> {
        let mut marks = vec![0u64; (n as usize).div_ceil(64)];
        for &i in kept {
            marks[i as usize / 64] |= 1 << (i % 64);
        }
        marks
    }

    /// `kept` of a shard of `n` events, in the form chosen for it.
    fn of(n: u32, kept: &[u32]) -> KeptEvents {
        KeptEvents::marked(n, &marks(n, kept))
    }

    /// Subsets of `n` events past one word: none, all, all but the first, last or middle
    /// one, and each of those alone.
    fn sparse_and_dense(n: u32) -> Vec<Vec<u32>> {
        let all: Vec<u32> = (0..n).collect();
        let mut sets = vec![vec![], all.clone()];
        for one in [0, n / 2, n - 1] {
            sets.push(vec![one]);
            sets.push(all.iter().copied().filter(|&i| i != one).collect());
        }
        sets
    }

    /// Every read of `events` against `kept`, the plain list: `starts` of runs, each read
    /// up to `run` events.
    fn check(events: &KeptEvents, kept: &[u32], starts: impl Iterator<Item = u32>, run: usize) {
        assert_eq!(events.len(), kept.len());
        assert_eq!(events.iter().collect::<Vec<_>>(), kept);
        for first in starts {
            let from = kept.get(first as usize..).unwrap_or_default();
            assert_eq!(events.iter_from(first).collect::<Vec<_>>(), from, "{first}");
            let mut located = vec![u32::MAX; from.len().min(run)];
            events.locate_run(first, located.iter_mut());
            assert_eq!(located, from[..located.len()], "{first}");
            if let Some(&index) = from.first() {
                assert_eq!(events.get(first), index, "{first}");
            }
        }
        let mut listed = xxhash_rust::xxh3::Xxh3::new();
        listed.update(&(kept.len() as u64).to_le_bytes());
        listed.update(as_bytes(kept));
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        events.digest_into(&mut hash);
        assert_eq!(
            hash.digest(),
            listed.digest(),
            "the digest of the listed events"
        );
    }

    #[test]
    fn both_forms_give_the_kept_events_in_order_and_the_same_digest() {
        for n in (0..=9).chain([63, 64, 65, 200]) {
            let few = (n > 9).then(|| sparse_and_dense(n)).into_iter().flatten();
            for kept in subsets(n.min(9)).filter(|_| n <= 9).chain(few) {
                for listed in [true, false] {
                    let events = KeptEvents::marked_in(n, &marks(n, &kept), kept.len(), listed);
                    assert_eq!(matches!(events.form, Form::Listed(_)), listed);
                    check(&events, &kept, 0..=kept.len() as u32 + 1, usize::MAX);
                }
            }
        }
    }

    proptest::proptest! {
        /// Random shards of up to 2,000 events, each event kept with a random chance (half
        /// the shards keeping nearly all): every read of both forms against the plain list.
        #[test]
        fn any_kept_events_read_back_as_listed(
            n in 0u32..2000,
            percent_kept in proptest::prop_oneof![0u32..=100, 95u32..=100],
            seed in proptest::prelude::any::<u64>(),
            starts in proptest::collection::vec(0u32..2100, 8),
        ) {
            let mut rng = crate::rng::Rng::new(seed);
            let kept: Vec<u32> = (0..n).filter(|_| rng.below(100) < percent_kept as u64).collect();
            for listed in [true, false] {
                let events = KeptEvents::marked_in(n, &marks(n, &kept), kept.len(), listed);
                check(&events, &kept, starts.iter().copied(), 300);
            }
            let chosen = of(n, &kept);
            let left_out = (n as usize - kept.len()) * LISTED_PER_LEFT_OUT;
            proptest::prop_assert_eq!(matches!(chosen.form, Form::Listed(_)), left_out > kept.len());
        }
    }

    #[test]
    fn a_shard_kept_but_for_a_few_holds_only_those() {
        let n = 100_000u32;
        let kept: Vec<u32> = (0..n).filter(|i| i % 100 != 7).collect();
        let events = of(n, &kept);
        // The 1,000 left out and a sample every 64 kept: under a byte per 8 kept events.
        assert!(
            events.held_bytes() * 8 < kept.len(),
            "{}",
            events.held_bytes()
        );
        // Past one chunk of the digest's expansion.
        check(
            &events,
            &kept,
            [0, 6, 7, 63, 64, 65, 98_999, 99_000].into_iter(),
            5000,
        );
    }
}
