//! A small, fast, seedable random number generator (SplitMix64). Deterministic across
//! platforms, so seeded outputs (synthetic data, permutations) are reproducible.

use crate::prefetch::prefetch_item;

/// SplitMix64: passes BigCrush, one `u64` of state.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator for stream `stream` of `seed` (independent streams from one seed).
    pub fn stream(seed: u64, stream: u64) -> Rng {
        let mut mixer = Rng(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        Rng(mixer.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// The 64 bits the call of [`Rng::next_u64`] `later` calls after the next one will
    /// give, without drawing them (SplitMix64's state is a counter).
    fn peek_u64(&self, later: u64) -> u64 {
        mix(self.0.wrapping_add(GAMMA.wrapping_mul(later + 1)))
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias worth measuring (Lemire's method).
    pub fn below(&mut self, n: u64) -> u64 {
        scaled_below(self.next_u64(), n)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Shuffles `items` in place (Fisher-Yates). Past [`SHUFFLE_PREFETCH_FROM`] items, each
    /// swap's far item is prefetched [`SHUFFLE_AHEAD`] swaps ahead, its index computed from
    /// the draw to come: the same swaps, whose cache misses then overlap, where each was
    /// waited for in turn.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        let prefetching = items.len() >= SHUFFLE_PREFETCH_FROM;
        for i in (1..items.len()).rev() {
            if prefetching && i > SHUFFLE_AHEAD {
                let later = i - SHUFFLE_AHEAD;
                let bits = self.peek_u64(SHUFFLE_AHEAD as u64);
                prefetch_item(&items[scaled_below(bits, later as u64 + 1) as usize]);
            }
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// SplitMix64's step between states.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output for state `z`.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Random `bits` scaled into `0..n` (Lemire's method).
fn scaled_below(bits: u64, n: u64) -> u64 {
    ((bits as u128 * n as u128) >> 64) as u64
}

/// Shuffles of at least this many items prefetch ahead ([`Rng::shuffle`]); smaller ones
/// stay in a core's caches.
const SHUFFLE_PREFETCH_FROM: usize = 1 << 16;

/// How many swaps ahead [`Rng::shuffle`] prefetches.
const SHUFFLE_AHEAD: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(1);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(1);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        let mut r = Rng::new(2);
        assert!((0..1000).all(|_| r.below(7) < 7 && (0.0..1.0).contains(&r.uniform())));
        let mut v: Vec<u32> = (0..100).collect();
        r.shuffle(&mut v);
        let mut s = v.clone();
        s.sort();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_ne!(v, s);
    }

    /// Shuffles that prefetch ahead make the same swaps as the plain Fisher-Yates, and
    /// leave the generator where it leaves it.
    #[test]
    fn a_prefetching_shuffle_is_the_plain_one() {
        let around = SHUFFLE_PREFETCH_FROM;
        for n in [
            0,
            1,
            2,
            17,
            around - 1,
            around,
            around + 1,
            around + SHUFFLE_AHEAD + 3,
        ] {
            let (mut fast, mut plain) = (Rng::new(n as u64), Rng::new(n as u64));
            let mut shuffled: Vec<u32> = (0..n as u32).collect();
            fast.shuffle(&mut shuffled);
            let mut expected: Vec<u32> = (0..n as u32).collect();
            for i in (1..n).rev() {
                let j = ((plain.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize;
                expected.swap(i, j);
            }
            assert_eq!(shuffled, expected, "{n} items");
            assert_eq!(
                fast.next_u64(),
                plain.next_u64(),
                "{n} items: the generator after"
            );
        }
        let rng = Rng::new(5);
        let mut drawn = rng.clone();
        for later in 0..4 {
            assert_eq!(rng.peek_u64(later), drawn.next_u64(), "{later} calls later");
        }
    }
}
