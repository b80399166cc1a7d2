//! The global event order of a dataset: events sorted by a seeded hash of their id.
//!
//! A good 64-bit hash of distinct ids is, for the purpose of ordering, a uniformly random
//! permutation; it needs no state, so every input file can be scattered independently and
//! the result does not depend on thread count or task split. Bucket `b` of `K` holds the
//! keys in `[b * 2^64 / K, (b + 1) * 2^64 / K)`, so concatenating the buckets' sorted runs
//! gives the global order.

/// The shuffle key of an event.
pub fn shuffle_key(seed: u64, event_id: i64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(&event_id.to_le_bytes(), seed)
}

/// The bucket (of `buckets`) a key falls in.
pub fn bucket_of(key: u64, buckets: u64) -> u64 {
    ((key as u128 * buckets as u128) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_key_ranges() {
        assert_eq!(bucket_of(0, 7), 0);
        assert_eq!(bucket_of(u64::MAX, 7), 6);
        let mut keys: Vec<u64> = (0..1000).map(|e| shuffle_key(5, e)).collect();
        keys.sort();
        let buckets: Vec<u64> = keys.iter().map(|&k| bucket_of(k, 9)).collect();
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]));
        assert_ne!(shuffle_key(5, 1), shuffle_key(6, 1));
    }
}
