//! Which events of one shard a view keeps: the kept events' indexes, or the left-out ones'
//! when those are far fewer. A split's larger part keeps most events of every shard, so it
//! lists the few it leaves out: a 1% validation split of the Kaggle set holds about 0.08
//! bytes per event over both views, where listing the kept events of both took 4 (528 MB
//! in every process that split 132M events).

use crate::format::pod::as_bytes;

/// A shard's kept events are held as the left-out ones when those are at most a quarter as
/// many. Locating a run of kept events steps over each left-out one on a branch that
/// mispredicts more the denser they are: a block of 256 events took 1.9-2.5 ns an event
/// to locate listed whatever the split, and listing what it leaves out 2.2 at 1% left out,
/// 3.5-3.7 at 10% and 6.1-6.5 at 50% (8M events, 2-vCPU Xeon).
const LISTED_PER_LEFT_OUT: usize = 4;

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
    /// For each left-out event, in ascending order, its index less its rank among the
    /// left-out ones: how many kept events come before it (so non-decreasing). The
    /// view's `i`-th event is `i` plus how many of these are at most `i`.
    AllBut(Vec<u32>),
}

impl KeptEvents {
    /// Of a shard of `shard_events` events, those whose bit is set in `marks` (bit `i %
    /// 64` of word `i / 64` for event `i`; bits past `shard_events` clear): listed, unless
    /// they are at least [`LISTED_PER_LEFT_OUT`] times as many as the left-out ones, which
    /// are listed then.
    pub(crate) fn marked(shard_events: u32, marks: &[u64]) -> KeptEvents {
        debug_assert_eq!(marks.len(), (shard_events as usize).div_ceil(64));
        let kept: usize = marks.iter().map(|w| w.count_ones() as usize).sum();
        let listed = (shard_events as usize - kept) * LISTED_PER_LEFT_OUT > kept;
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
                Form::AllBut(indexes)
            }
        };
        KeptEvents { shard_events, form }
    }

    /// How many events are kept.
    pub fn len(&self) -> usize {
        match &self.form {
            Form::Listed(kept) => kept.len(),
            Form::AllBut(left_out) => self.shard_events as usize - left_out.len(),
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
            Form::AllBut(_) => {
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
        let (Form::Listed(v) | Form::AllBut(v)) = &self.form;
        v.capacity() * size_of::<u32>()
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
            Form::AllBut(kept_before) => kept_before.partition_point(|&k| k <= first),
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
            Form::AllBut(kept_before) => {
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

    /// `kept` of a shard of `n` events, marked.
    fn of(n: u32, kept: &[u32]) -> KeptEvents {
        let mut marks = vec![0u64; (n as usize).div_ceil(64)];
        for &i in kept {
            marks[i as usize / 64] |= 1 << (i % 64);
        }
        KeptEvents::marked(n, &marks)
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

    #[test]
    fn both_forms_give_the_kept_events_in_order_and_the_same_digest() {
        let mut forms = [0, 0];
        for n in (0..=9).chain([63, 64, 65]) {
            let few = (n > 9).then(|| sparse_and_dense(n)).into_iter().flatten();
            for kept in subsets(n.min(9)).filter(|_| n <= 9).chain(few) {
                let events = of(n, &kept);
                forms[usize::from(matches!(events.form, Form::AllBut(_)))] += 1;
                assert_eq!(events.len(), kept.len(), "{kept:?} of {n}");
                assert_eq!(events.iter().collect::<Vec<_>>(), kept, "of {n}");
                for (i, &index) in kept.iter().enumerate() {
                    assert_eq!(events.get(i as u32), index, "{i} of {kept:?} of {n}");
                }
                for first in 0..=kept.len() + 1 {
                    let from: Vec<u32> = events.iter_from(first as u32).collect();
                    assert_eq!(from, kept.get(first..).unwrap_or_default(), "{first}, {n}");
                    let mut run = vec![u32::MAX; kept.len().saturating_sub(first)];
                    events.locate_run(first as u32, run.iter_mut());
                    assert_eq!(run, from, "{first}, {n}");
                }
                let listed = |kept: &[u32]| {
                    let mut hash = xxhash_rust::xxh3::Xxh3::new();
                    hash.update(&(kept.len() as u64).to_le_bytes());
                    hash.update(as_bytes(kept));
                    hash.digest()
                };
                let mut hash = xxhash_rust::xxh3::Xxh3::new();
                events.digest_into(&mut hash);
                assert_eq!(hash.digest(), listed(&kept), "{kept:?} of {n}");
            }
        }
        assert!(
            forms[0] > 900 && forms[1] > 50,
            "both forms tried: {forms:?}"
        );
    }

    proptest::proptest! {
        /// Random shards of up to 2,000 events, each event kept with a random chance: every
        /// read of both forms against the plain list.
        #[test]
        fn any_kept_events_read_back_as_listed(
            n in 0u32..2000,
            percent_kept in 0u32..=100,
            seed in proptest::prelude::any::<u64>(),
            starts in proptest::collection::vec(0u32..2100, 8),
        ) {
            let mut rng = crate::rng::Rng::new(seed);
            let kept: Vec<u32> = (0..n).filter(|_| rng.below(100) < percent_kept as u64).collect();
            let events = of(n, &kept);
            proptest::prop_assert_eq!(events.len(), kept.len());
            proptest::prop_assert_eq!(events.iter().collect::<Vec<_>>(), kept.clone());
            for first in starts {
                let from = kept.get(first as usize..).unwrap_or_default();
                let mut run = vec![u32::MAX; from.len().min(300)];
                events.locate_run(first, run.iter_mut());
                proptest::prop_assert_eq!(&run[..], &from[..run.len()]);
                if let Some(&index) = from.first() {
                    proptest::prop_assert_eq!(events.get(first), index);
                }
            }
        }
    }

    #[test]
    fn a_shard_kept_but_for_a_few_holds_only_those() {
        let n = 100_000u32;
        let kept: Vec<u32> = (0..n).filter(|i| i % 100 != 7).collect();
        let events = of(n, &kept);
        assert!(events.held_bytes() <= 1000 * 4, "{}", events.held_bytes());
        assert_eq!(events.iter().collect::<Vec<_>>(), kept);
        for i in [0, 6, 7, 98_999] {
            assert_eq!(events.get(i), kept[i as usize]);
        }
        // A digest past one chunk of expansion.
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        events.digest_into(&mut hash);
        let mut listed = xxhash_rust::xxh3::Xxh3::new();
        listed.update(&(kept.len() as u64).to_le_bytes());
        listed.update(as_bytes(&kept));
        assert_eq!(hash.digest(), listed.digest());
    }
}
