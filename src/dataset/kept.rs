//! Which events of one shard a view keeps: the kept events' indexes when they are few, the
//! left-out ones' when those are, and a bit per event between. The training part of a
//! small validation split keeps nearly every event of every shard, so it lists the few it
//! leaves out: a 1% split of the Kaggle set holds about 0.14 bytes per event over both
//! views, where listing the kept events of both took 4 (528 MB in every process that split
//! 132M events). A larger split marks its parts' events a bit each where they are more
//! than a 16th of a shard: 0.30-0.43 bytes per event over both views of any split from 3%
//! (0.36 for `split(0.1)`, 47 MB at 132M events), where listing them took 4.

use crate::format::pod::as_bytes;

/// A shard's kept events are held as the left-out ones when these are at most a 32nd as
/// many (about 3% of the shard left out). Finding a kept event from the left-out ones costs
/// more the denser they are: a pulse budget asks each event of a window alone, in drawn
/// order, and planned a window of 16 blocks at 21-22 ns an event listed, 24 listing the
/// left-out 1%, 32 listing the left-out 10% (320k events with the real statistics). A
/// validation split of 1-3% keeps its training part in about 0.1 byte an event.
const LISTED_PER_LEFT_OUT: usize = 32;

/// A shard's kept events are listed when they are at most a 16th of its events: 4 bytes a
/// kept event, at most a quarter of a byte an event of the shard, where a bit per event
/// (with its samples) holds about a fifth. Between, the kept events are marked a bit each
/// (see [`Form::Marked`]).
const EVENTS_PER_LISTED: usize = 16;

/// Every this many kept events, an all-but form notes how many left-out events come before
/// (a marked form samples as often or more, see [`sample_shift`]): a kept event asked alone
/// (as a pulse budget asks each event of a window in drawn order) is then found a few steps
/// from its sample, where a binary search over a shard's left-out events took 38-46 ns an
/// event to plan a window of 16 blocks against 21 listed (320k events with the real
/// statistics, the 99% and 90% views of a split). 0.06 bytes a kept event.
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
    /// Every event of the shard a bit, set where kept. A kept event asked alone costs more
    /// to find than in a list while the list stays in the CPU's caches (the 90% and 50%
    /// views of 1M events: 20-30 ns an event against 5-14), and about the same once it
    /// does not (of 8M events: 28-33 against 20-37); a run of them costs a step each (the
    /// 10% of 8M: 3.5-4.3 ns an event against 1.6-2.4 listed).
    Marked {
        /// Bit `i % 64` of word `i / 64` for event `i`; bits past the shard's events clear.
        marks: Vec<u64>,
        /// The shard index of every `2^sample_shift`-th kept event: where counting bits for
        /// any kept event starts, fewer than that many kept events short of it.
        samples: Vec<u32>,
        /// Log2 of the kept events from one sample to the next: about as many as a word
        /// holds (see [`sample_shift`]), so that a kept event asked alone is found in the
        /// word of its sample or the next.
        sample_shift: u32,
        /// How many are set.
        kept: usize,
    },
}

/// Which form a shard's kept events take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Listed,
    AllBut,
    Marked,
}

impl Kind {
    /// The form for `kept` events of a shard of `shard_events`: the left-out ones listed
    /// when they are at most a [`LISTED_PER_LEFT_OUT`]th of the kept ones, the kept ones
    /// when they are at most a [`EVENTS_PER_LISTED`]th of the shard, else a bit each.
    fn of(shard_events: u32, kept: usize) -> Kind {
        let left_out = shard_events as usize - kept;
        if left_out * LISTED_PER_LEFT_OUT <= kept {
            Kind::AllBut
        } else if kept * EVENTS_PER_LISTED <= shard_events as usize {
            Kind::Listed
        } else {
            Kind::Marked
        }
    }
}

impl KeptEvents {
    /// Of a shard of `shard_events` events, those whose bit is set in `marks` (bit `i %
    /// 64` of word `i / 64` for event `i`; bits past `shard_events` clear): the left-out
    /// ones listed when the kept ones are at least [`LISTED_PER_LEFT_OUT`] times as many,
    /// the kept ones listed when they are at most a [`EVENTS_PER_LISTED`]th of the shard,
    /// else the marks kept.
    pub(crate) fn marked(shard_events: u32, marks: Vec<u64>) -> KeptEvents {
        let kept: usize = marks.iter().map(|w| w.count_ones() as usize).sum();
        KeptEvents::marked_in(shard_events, marks, kept, Kind::of(shard_events, kept))
    }

    /// As [`KeptEvents::marked`], of `kept` marked events, in the form `kind`.
    fn marked_in(shard_events: u32, marks: Vec<u64>, kept: usize, kind: Kind) -> KeptEvents {
        debug_assert_eq!(marks.len(), (shard_events as usize).div_ceil(64));
        let form = match kind {
            Kind::Listed => Form::Listed(indexes_of(&marks, shard_events, kept, true)),
            Kind::AllBut => {
                let left_out = shard_events as usize - kept;
                let mut kept_before = indexes_of(&marks, shard_events, left_out, false);
                for (rank, index) in kept_before.iter_mut().enumerate() {
                    *index -= rank as u32;
                }
                let samples = (0..kept)
                    .step_by(SAMPLED)
                    .map(|i| kept_before.partition_point(|&k| k as usize <= i) as u32)
                    .collect();
                Form::AllBut {
                    kept_before,
                    samples,
                }
            }
            Kind::Marked => {
                let sample_shift = sample_shift(shard_events, kept);
                let samples = sampled_marks(&marks, kept, 1 << sample_shift);
                Form::Marked {
                    marks,
                    samples,
                    sample_shift,
                    kept,
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
            Form::Marked { kept, .. } => *kept,
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
            Form::AllBut { .. } | Form::Marked { .. } => {
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
            Form::Marked { marks, samples, .. } => marks.capacity() * 2 + samples.capacity(),
        };
        held * size_of::<u32>()
    }
}

/// A walk over a shard's kept events, from one of them on.
enum Walk<'k> {
    Listed {
        kept: &'k [u32],
        /// The place of the next kept event in the list.
        at: usize,
    },
    AllBut {
        kept_before: &'k [u32],
        /// How many left-out events come before `next`.
        at: usize,
        /// The shard index the next kept event is at or after.
        next: u32,
    },
    Marked {
        marks: &'k [u64],
        /// The word the next kept event is in or after.
        word: usize,
        /// That word's bits from the next kept event on.
        bits: u64,
    },
}

impl<'k> Walk<'k> {
    /// At the `first`-th kept event: for the all-but form, the left-out events with at
    /// most `first` kept events before them come before it; for the marked form, its
    /// sample's bit and the kept events' bits after it counted.
    #[inline]
    fn from(form: &'k Form, first: u32) -> Walk<'k> {
        match form {
            Form::Listed(kept) => Walk::Listed {
                kept,
                at: first as usize,
            },
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
                Walk::AllBut {
                    kept_before,
                    at,
                    next: first + at as u32,
                }
            }
            Form::Marked {
                marks,
                samples,
                sample_shift,
                kept,
            } => Walk::marked_from(marks, samples, *sample_shift, *kept, first),
        }
    }

    /// At the `first`-th of the `kept` events set in `marks` (see [`Form::Marked`]): its
    /// sample's bit, and the kept events' bits after it counted. Apart from
    /// [`Walk::from`], which the other forms' few steps are inlined with.
    fn marked_from(
        marks: &'k [u64],
        samples: &[u32],
        sample_shift: u32,
        kept: usize,
        first: u32,
    ) -> Walk<'k> {
        if first as usize >= kept {
            // Past the last kept event: no step is taken.
            let word = marks.len();
            return Walk::Marked {
                marks,
                word,
                bits: 0,
            };
        }
        let sample = samples[first as usize >> sample_shift] as usize;
        let mut word = sample / 64;
        let mut bits = marks[word] & (u64::MAX << (sample % 64));
        let mut skip = first & ((1 << sample_shift) - 1);
        // The set bits counted once a word, for both the skip and the search.
        let mut sums = set_bit_sums(bits);
        while skip >= (sums >> 56) as u32 {
            skip -= (sums >> 56) as u32;
            word += 1;
            bits = marks[word];
            sums = set_bit_sums(bits);
        }
        bits &= u64::MAX << nth_set_bit_summed(bits, sums, skip);
        Walk::Marked { marks, word, bits }
    }

    /// The next kept event's shard index (there must be one).
    fn step(&mut self) -> u32 {
        match self {
            Walk::Listed { kept, at } => {
                *at += 1;
                kept[*at - 1]
            }
            Walk::AllBut {
                kept_before,
                at,
                next,
            } => {
                // Over the left-out events here: the next has `next - at` kept before it.
                while kept_before.get(*at) == Some(&(*next - *at as u32)) {
                    (*next, *at) = (*next + 1, *at + 1);
                }
                *next += 1;
                *next - 1
            }
            Walk::Marked { marks, word, bits } => {
                while *bits == 0 {
                    *word += 1;
                    *bits = marks[*word];
                }
                let bit = bits.trailing_zeros();
                *bits &= *bits - 1;
                *word as u32 * 64 + bit
            }
        }
    }
}

/// The indexes of the `count` events of a shard of `shard_events` whose bit in `marks` is
/// `set` (or clear), ascending.
fn indexes_of(marks: &[u64], shard_events: u32, count: usize, set: bool) -> Vec<u32> {
    let flip = if set { 0 } else { u64::MAX };
    let mut indexes = Vec::with_capacity(count);
    for (w, &word) in marks.iter().enumerate() {
        let mut bits = word ^ flip;
        let past_the_end = (w + 1) * 64 > shard_events as usize;
        if !set && past_the_end {
            bits &= u64::MAX >> ((w + 1) * 64 - shard_events as usize);
        }
        while bits != 0 {
            indexes.push(w as u32 * 64 + bits.trailing_zeros());
            bits &= bits - 1;
        }
    }
    indexes
}

/// The place of the `n`-th set bit of `word` (counted from 0, the lowest; `word` must have
/// more than `n`).
fn nth_set_bit(word: u64, n: u32) -> u32 {
    nth_set_bit_summed(word, set_bit_sums(word), n)
}

/// Per byte `b` of the result, the set bits of bytes 0 to `b` of `word` (at most 64: no
/// byte overflows), the top byte holding them all: the set bits counted per byte, then
/// summed from the lowest byte up by one multiplication.
fn set_bit_sums(word: u64) -> u64 {
    let mut bytes = word - ((word >> 1) & 0x5555_5555_5555_5555);
    bytes = (bytes & 0x3333_3333_3333_3333) + ((bytes >> 2) & 0x3333_3333_3333_3333);
    bytes = (bytes + (bytes >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    bytes.wrapping_mul(BYTE_ONES)
}

/// [`nth_set_bit`] of `word` given its [`set_bit_sums`], without a branch: the byte holding
/// the bit found by comparing all eight sums with `n` at once, then the bit in that byte
/// looked up.
fn nth_set_bit_summed(word: u64, sums: u64, n: u32) -> u32 {
    debug_assert!(n < word.count_ones());
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    // Byte `b`'s high bit stays set where its sum is at most `n` (`0x80 + n - sum` never
    // borrows from the next byte, both being at most 64): the bytes wholly before the bit.
    let at_most_n = (((n as u64 * BYTE_ONES) | HIGH_BITS) - sums) & HIGH_BITS;
    let byte = ((at_most_n >> 7).wrapping_mul(BYTE_ONES) >> 56) as u32;
    // The set bits before that byte: the sum of the byte below it (0 below byte 0).
    let before = ((sums << 8) >> (8 * byte)) as u32 & 0xff;
    let in_byte = (word >> (8 * byte)) as u8;
    8 * byte + NTH_SET_BIT_OF_BYTE[in_byte as usize][(n - before) as usize & 7] as u32
}

/// A one in each byte.
const BYTE_ONES: u64 = 0x0101_0101_0101_0101;

/// For each byte, the place of its `k`-th set bit, for `k` below its set bits (8 where it
/// has no `k`-th).
static NTH_SET_BIT_OF_BYTE: [[u8; 8]; 256] = {
    let mut table = [[8u8; 8]; 256];
    let mut byte = 0;
    while byte < 256 {
        let (mut bit, mut k) = (0, 0);
        while bit < 8 {
            if byte >> bit & 1 == 1 {
                table[byte][k] = bit as u8;
                k += 1;
            }
            bit += 1;
        }
        byte += 1;
    }
    table
};

/// Log2 of the kept events from one sample of a marked form to the next: about as many as
/// a word of the marks holds on average (the kept events' share of 64, rounded up to a
/// power of two), at most [`SAMPLED`]. A kept event asked alone is found a word or two from
/// its sample, where a sample every 64 kept events left up to 16 words to count at the
/// sparsest marked shard; the samples hold about 4 bytes a word, 1/16 byte an event.
fn sample_shift(shard_events: u32, kept: usize) -> u32 {
    let per_word = (kept * 64).div_ceil((shard_events as usize).max(1));
    per_word
        .clamp(1, SAMPLED)
        .next_power_of_two()
        .trailing_zeros()
}

/// The shard index of every `every`-th of the `kept` events set in `marks` (`every` a power
/// of two).
fn sampled_marks(marks: &[u64], kept: usize, every: usize) -> Vec<u32> {
    let mut samples = Vec::with_capacity(kept.div_ceil(every));
    // How many kept events come before the word.
    let mut before = 0usize;
    for (w, &word) in marks.iter().enumerate() {
        let count = word.count_ones() as usize;
        // The next sampled kept event, if it is in this word.
        let mut next = before.next_multiple_of(every);
        while next < before + count {
            samples.push(w as u32 * 64 + nth_set_bit(word, (next - before) as u32));
            next += every;
        }
        before += count;
    }
    samples
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
        KeptEvents::marked(n, marks(n, kept))
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

    /// Every form, `kept` of a shard of `n` events in each.
    fn in_every_form(n: u32, kept: &[u32]) -> [KeptEvents; 3] {
        [Kind::Listed, Kind::AllBut, Kind::Marked].map(|kind| {
            let events = KeptEvents::marked_in(n, marks(n, kept), kept.len(), kind);
            assert_eq!(kind_of(&events), kind);
            events
        })
    }

    /// The form `events` took.
    fn kind_of(events: &KeptEvents) -> Kind {
        match events.form {
            Form::Listed(_) => Kind::Listed,
            Form::AllBut { .. } => Kind::AllBut,
            Form::Marked { .. } => Kind::Marked,
        }
    }

    #[test]
    fn every_form_gives_the_kept_events_in_order_and_the_same_digest() {
        for n in (0..=9).chain([63, 64, 65, 200]) {
            let few = (n > 9).then(|| sparse_and_dense(n)).into_iter().flatten();
            for kept in subsets(n.min(9)).filter(|_| n <= 9).chain(few) {
                for events in in_every_form(n, &kept) {
                    check(&events, &kept, 0..=kept.len() as u32 + 1, usize::MAX);
                }
            }
        }
    }

    #[test]
    fn a_marked_shard_samples_about_a_words_worth_of_kept_events() {
        // (kept events in 1,024, kept events between samples).
        for (kept, every) in [(64, 4), (65, 8), (100, 8), (512, 32), (900, 64), (1000, 64)] {
            assert_eq!(1 << sample_shift(1024, kept), every, "{kept}");
        }
    }

    #[test]
    fn the_nth_set_bit_of_a_word_is_where_counting_set_bits_finds_it() {
        let mut rng = crate::rng::Rng::new(7);
        let words = [1, 1 << 63, u64::MAX, 0x8000_0001_0000_0001];
        for word in words.into_iter().chain((0..2000).map(|_| rng.next_u64())) {
            let places: Vec<u32> = (0..64).filter(|b| word >> b & 1 == 1).collect();
            for (n, &place) in places.iter().enumerate() {
                assert_eq!(nth_set_bit(word, n as u32), place, "{word:#x} {n}");
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
            for events in in_every_form(n, &kept) {
                check(&events, &kept, starts.iter().copied(), 300);
            }
            let chosen = of(n, &kept);
            let left_out = n as usize - kept.len();
            let expected = if left_out * LISTED_PER_LEFT_OUT <= kept.len() {
                Kind::AllBut
            } else if kept.len() * EVENTS_PER_LISTED <= n as usize {
                Kind::Listed
            } else {
                Kind::Marked
            };
            proptest::prop_assert_eq!(kind_of(&chosen), expected);
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

    #[test]
    fn a_shard_kept_in_part_holds_a_bit_an_event_and_its_samples() {
        let n = 100_000u32;
        for (every, kept_of_every) in [(2, 1), (10, 1), (10, 9), (16, 2)] {
            let kept: Vec<u32> = (0..n).filter(|i| i % every < kept_of_every).collect();
            let events = of(n, &kept);
            assert_eq!(kind_of(&events), Kind::Marked, "{kept_of_every} in {every}");
            // A bit an event, and about a sample a word: 0.125 + 0.0625 bytes an event at
            // most, where listing the kept ones took 4 each.
            let bound = n as usize / 8 + n as usize / 16 + 8;
            assert!(events.held_bytes() <= bound, "{}", events.held_bytes());
            check(
                &events,
                &kept,
                [0, 1, 63, 64, 65, 4095, 4096]
                    .into_iter()
                    .chain([kept.len() as u32 - 1]),
                5000,
            );
        }
    }
}
