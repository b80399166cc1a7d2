//! Whether a conversion fits its memory limit, decided from the inputs' footers before a
//! unit runs.
//!
//! Two things grow with the number of buckets whatever the units lease: each scatter
//! unit's spill buffers (one per bucket its batch reaches, of at least
//! [`spill::MIN_BUFFER_BYTES`]) and the spill indexes the gather holds (a chunk per buffer
//! written). Where the limit or the shard size is small for the input, they alone took
//! more than the limit: 1M events under 64 MiB with 256 KiB shards (7,268 buckets) peaked
//! at 155.9 MiB, 200k events in 2 files with 64 KiB shards at 130.1 MiB, and the Kaggle
//! training set (21.2G pulses, 660 files) under 512 MiB would hold about 470 MB of
//! indexes beside buckets of 2.6M pulses. Such a conversion is refused, or warned of where it may still fit, with the
//! limit that would fit.

use super::bucket_shard::events_memory;
use super::plan::{bucket_count, SPILL_BYTES_PER_PULSE};
use super::spill::{self, SpillChunk};
use super::{ConvertOptions, SCATTER_DECODE_MEMORY};
use crate::error::{Error, Result};

/// Spill chunks written per chunk counted by buffer fills (see [`held_memory`]).
const CHUNKS_COUNTED: f64 = 0.75;

/// What the plan knows of the input: pulses and events in all, and batch files.
#[derive(Debug, Clone, Copy)]
pub struct InputShape {
    /// Pulses (rows of the batch files).
    pub pulses: u64,
    /// Events (rows of the meta).
    pub events: u64,
    /// Batch files.
    pub batches: u64,
}

/// Estimated memory held beside the units' leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldMemory {
    /// The buckets the plan makes.
    pub buckets: u64,
    /// One scatter unit's spill buffers.
    pub scatter_buffers: u64,
    /// The spill indexes the gather holds through its phase.
    pub gather_index: u64,
    /// Pulses and events of a bucket of the average size; the gather holds at least one
    /// such bucket beside its indexes.
    pub bucket_pulses: u64,
    /// See [`HeldMemory::bucket_pulses`].
    pub bucket_events: u64,
}

/// Bytes a bucket being gathered holds per pulse, measured (it leases 64).
const GATHERED_BYTES_PER_PULSE: u64 = 50;

/// Memory a conversion holds whatever its units: the program's mapped pages (8 MiB
/// measured, of the 32 MiB [`super::FIXED_OVERHEAD`] allows).
const PROGRAM_MEMORY: u64 = 8 << 20;

impl HeldMemory {
    /// What a bucket of the average size leases while it is gathered ([`events_memory`]).
    pub fn gather_bucket(&self) -> u64 {
        events_memory(self.bucket_pulses, self.bucket_events)
    }

    /// Whether this alone, with the program, takes more than `limit`: a scatter unit's
    /// buffers, or the gather's indexes beside a bucket as resident as measured.
    fn past(&self, limit: u64) -> bool {
        let gathered = self.gather_index + self.bucket_pulses * GATHERED_BYTES_PER_PULSE;
        self.scatter_buffers.max(gathered) + PROGRAM_MEMORY > limit
    }

    /// Whether this cannot fit the units' memory `room`: either part alone takes more (a
    /// scatter unit's buffers then run alone beside its decoding, and the gather's
    /// indexes beside a bucket, past the limit).
    fn cannot_fit(&self, room: u64) -> bool {
        self.scatter_buffers > room || self.gather_index + self.gather_bucket() > room
    }

    /// Whether this fits the units' memory `room` with the units' estimates: a scatter
    /// unit (its decoding and buffers) within it, and the gather's indexes with two
    /// buckets (as the plan sizes them).
    fn fits(&self, room: u64) -> bool {
        SCATTER_DECODE_MEMORY + self.scatter_buffers <= room
            && self.gather_index + 2 * self.gather_bucket() <= room
    }
}

/// What `shape` converted with `options` holds beside the units' leases (expected values:
/// events fall in buckets by a hash).
pub fn held_memory(shape: InputShape, options: &ConvertOptions) -> HeldMemory {
    let buckets = bucket_count(shape.pulses, options) as f64;
    let batches = shape.batches.max(1) as f64;
    let events_per_batch = shape.events as f64 / batches;
    let spill_per_batch = (shape.pulses * SPILL_BYTES_PER_PULSE) as f64 / batches;
    // Buckets reached by a batch's events, each drawn uniformly.
    let reached = buckets * -(-events_per_batch / buckets).exp_m1();
    let capacity = spill::buffer_capacity(options.scatter_budget(), buckets as usize) as f64;
    // A buffer is allocated whole when its share is small, and resident as far as it is
    // written (its pages, and the next allocation's header on the page after); a larger
    // share grows with what it holds.
    let page = 4096.0;
    let buffers = if capacity as usize <= spill::WHOLE_SHARE_BYTES {
        let written = (spill_per_batch / reached.max(1.0)).min(capacity);
        reached * ((written / page).ceil() * page + page).min(capacity)
    } else {
        (reached * capacity).min(spill_per_batch)
    };
    // A chunk per full buffer, and each reached bucket's last one (half full on average);
    // with the real statistics three quarters of that, the large events leaving in a
    // chunk each (1M events in 8 files: 11.5k chunks a batch against 16.3k so counted with
    // 909 buckets, 14.4k against 19.4k with 7,268).
    let chunks = batches * (reached / 2.0 + spill_per_batch / capacity) * CHUNKS_COUNTED;
    let bucket_count = buckets as u64;
    HeldMemory {
        buckets: bucket_count,
        scatter_buffers: buffers as u64,
        gather_index: (chunks * std::mem::size_of::<SpillChunk>() as f64) as u64,
        bucket_pulses: shape.pulses.div_ceil(bucket_count),
        bucket_events: shape.events.div_ceil(bucket_count),
    }
}

/// Whether `shape` converted with `options` [fits](HeldMemory::fits) the units' memory.
fn fits(shape: InputShape, options: &ConvertOptions) -> bool {
    held_memory(shape, options).fits(options.unit_memory())
}

/// Refuses `options` for `shape` where what they hold beside the units' leases, with the
/// program alone, exceeds the limit; warns where it takes more than the limit's
/// accounting leaves for the data (the converter's own estimates are generous: such a
/// conversion may still keep within the limit). Both name the smallest limit (to 1 MiB)
/// where it fits with the units' estimates.
pub fn check(shape: InputShape, options: &ConvertOptions) -> Result<()> {
    let held = held_memory(shape, options);
    let limit = options.memory_limit_bytes;
    let certain = held.past(limit);
    if !certain && !held.cannot_fit(options.unit_memory()) {
        return Ok(());
    }
    let with_limit = |limit: u64| ConvertOptions {
        memory_limit_bytes: limit,
        ..options.clone()
    };
    // The smallest fitting limit, by doubling then bisecting (more memory means fewer
    // buckets and larger buffers: both parts shrink as the limit grows).
    let (mut low, mut high) = (limit, limit * 2);
    while !fits(shape, &with_limit(high)) && high < 1 << 50 {
        (low, high) = (high, high * 2);
    }
    while high - low > 1 << 20 {
        let middle = low + (high - low) / 2;
        if fits(shape, &with_limit(middle)) {
            high = middle;
        } else {
            low = middle;
        }
    }
    let mib = |bytes: u64| bytes.div_ceil(1 << 20);
    let what = format!(
        "this input ({} pulses in {} batch files) with --shard-size {} KiB and {} threads: \
         its {} buckets' scatter buffers (per unit) would take about {} MiB, and the \
         gather's spill indexes about {} MiB beside a bucket's {} MiB",
        shape.pulses,
        shape.batches,
        options.shard_target_bytes >> 10,
        options.threads_within_limit(),
        held.buckets,
        mib(held.scatter_buffers),
        mib(held.gather_index),
        mib(held.gather_bucket()),
    );
    let remedy = format!(
        "at least {} MiB keeps within it (or a larger shard size, where it sets the bucket \
         count)",
        mib(high)
    );
    if certain {
        return Err(Error::config(
            "memory_limit",
            format!(
                "--memory-limit {} MiB cannot hold {what}, more than the limit; {remedy}",
                mib(limit)
            ),
        ));
    }
    tracing::warn!(
        "--memory-limit {} MiB may be exceeded by {what}, beyond the {} MiB the limit \
         leaves for the data; {remedy}",
        mib(limit),
        options.unit_memory() >> 20
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Kaggle training set (DESIGN.md): 21.2G pulses, 131,953,924 events, 660 files.
    const KAGGLE: InputShape = InputShape {
        pulses: 21_200_000_000,
        events: 131_953_924,
        batches: 660,
    };
    /// `shardify-gen --events 1000000 --files 8 --seed 5`.
    const GENERATED_1M: InputShape = InputShape {
        pulses: 158_754_598,
        events: 1_000_000,
        batches: 8,
    };

    fn options(limit_mib: u64, shard_kib: u64, threads: usize) -> ConvertOptions {
        ConvertOptions {
            memory_limit_bytes: limit_mib << 20,
            shard_target_bytes: shard_kib << 10,
            threads,
            ..ConvertOptions::default()
        }
    }

    #[test]
    fn conversions_measured_within_their_limit_pass_and_those_measured_past_it_do_not() {
        // Measured within: the Kaggle set under 2 GiB; 1M events under 64 MiB (53.6-58.5
        // MiB, on 2 to 64 threads).
        for (shape, options) in [
            (KAGGLE, options(2048, 256 << 10, 2)),
            (KAGGLE, options(2048, 256 << 10, 16)),
            (KAGGLE, options(2048, 256 << 10, 64)),
            (GENERATED_1M, options(64, 256 << 10, 2)),
            (GENERATED_1M, options(64, 256 << 10, 64)),
        ] {
            let held = held_memory(shape, &options);
            assert!(
                !held.cannot_fit(options.unit_memory()),
                "{shape:?} {options:?}: {held:?}"
            );
            check(shape, &options).unwrap();
        }
        // Measured past it: 1M events under 64 MiB with 256 KiB shards peaked at 155.9 MiB.
        let past = options(64, 256, 2);
        let held = held_memory(GENERATED_1M, &past);
        assert!(held.scatter_buffers > 64 << 20, "{held:?}");
        let error = check(GENERATED_1M, &past).unwrap_err().to_string();
        assert!(
            error.contains("--memory-limit 64 MiB cannot hold"),
            "{error}"
        );
        assert!(
            error.contains("at least 179 MiB keeps within it"),
            "{error}"
        );
    }

    #[test]
    fn the_kaggle_set_under_half_a_gib_is_refused_for_its_spill_indexes() {
        let small = options(512, 256 << 10, 2);
        let held = held_memory(KAGGLE, &small);
        // About 8,100 buckets in 660 files, with buffers of 26 KiB: about 10M chunks,
        // beside a bucket of 2.6M pulses.
        assert!(
            held.gather_index + held.gather_bucket() > 512 << 20
                && held.scatter_buffers < 256 << 20,
            "{held:?}"
        );
        let error = check(KAGGLE, &small).unwrap_err().to_string();
        let needed: u64 = error
            .split("at least ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no limit named: {error}"));
        // What it names fits, and 1 MiB less does not.
        assert!(fits(KAGGLE, &options(needed, 256 << 10, 2)), "{needed} MiB");
        assert!(
            !fits(KAGGLE, &options(needed - 1, 256 << 10, 2)),
            "{needed} MiB"
        );
        assert!((512..2048).contains(&needed), "{needed} MiB");
    }

    #[test]
    fn the_estimates_shrink_as_the_limit_grows() {
        let mut last = held_memory(KAGGLE, &options(256, 256 << 10, 2));
        for limit in [384, 512, 768, 1024, 2048, 4096] {
            let held = held_memory(KAGGLE, &options(limit, 256 << 10, 2));
            assert!(
                held.gather_index <= last.gather_index,
                "{limit}: {held:?} {last:?}"
            );
            last = held;
        }
    }
}
