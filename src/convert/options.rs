//! The options of a conversion, and how its memory limit is shared: a fixed overhead, the
//! threads' own memory, and what the units of a phase lease (see [`super::memory_bank`]).

use super::spill;
use crate::error::{Error, Result};
use crate::format::ShardLayout;

/// Options of a conversion.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Seed of the global shuffle.
    pub seed: u64,
    /// Worker threads (does not change the output); by default the
    /// [cores this process may run on](crate::cores::available_cores).
    pub threads: usize,
    /// Bound on the converter's memory use, in bytes (can lower the shard size).
    pub memory_limit_bytes: u64,
    /// Target shard size in bytes.
    pub shard_target_bytes: u64,
    /// Allow narrowing charge and positions to `f32` even where values change.
    pub lossy: bool,
    /// The shards' layout ([`crate::format::records`]).
    pub layout: ShardLayout,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            seed: 0,
            threads: crate::cores::available_cores(),
            memory_limit_bytes: 4 << 30,
            shard_target_bytes: 256 << 20,
            lossy: false,
            layout: ShardLayout::Columns,
        }
    }
}

/// The smallest memory limit accepted, in bytes.
pub const MIN_MEMORY_LIMIT: u64 = 48 << 20;

/// Memory the converter needs whatever the data: the program, the geometry, the plan,
/// thread stacks (measured: 20 MiB resident after the plan phase on 2 cores; 8 more keep
/// the peak within the limit when a phase starts where the last one left its heap). The rest of
/// the limit is the working memory, shared by the units of a phase.
pub const FIXED_OVERHEAD: u64 = 32 << 20;

/// Memory each converter thread holds of its own, whatever the data: its stack and its
/// allocator arena's slack (glibc gives each thread an arena of its own, up to 8 per
/// core). Measured on 1M events under a 64 MiB limit: 1 thread peaked at 53.7 MiB, 64
/// threads with 64 arenas at 72.7-74.0 MiB, 0.30-0.32 MiB a thread; counted in no lease,
/// it overran the limit (64 threads with 16 arenas: 63.4-67.4 MiB).
pub const THREAD_MEMORY: u64 = 512 << 10;

/// Memory of one scatter unit besides its spill buffers: the Parquet page readers and the
/// decoded rows (11 MiB measured alone), the event being assembled and its encoded record
/// (a few MiB for the largest real events), the spill file's write buffer, and what the
/// allocator keeps of them (measured on data with the real statistics: each unit held
/// 13-14 MiB above its budget with 16 MiB assumed here).
pub const SCATTER_DECODE_MEMORY: u64 = 32 << 20;

/// The smallest spill buffer of a scatter unit: smaller ones write tiny chunks.
pub(super) const MIN_SPILL_BUFFER: u64 = 4 << 20;

impl ConvertOptions {
    /// Rejects options that cannot work.
    pub fn validate(&self) -> Result<()> {
        if self.threads == 0 {
            return Err(Error::config("threads", "--threads must be at least 1"));
        }
        if self.memory_limit_bytes < MIN_MEMORY_LIMIT {
            return Err(Error::config(
                "memory_limit",
                format!(
                    "--memory-limit must be at least {} MiB",
                    MIN_MEMORY_LIMIT >> 20
                ),
            ));
        }
        if self.shard_target_bytes < 4096 {
            return Err(Error::config(
                "shard_size",
                "--shard-size must be at least 4 KiB",
            ));
        }
        Ok(())
    }

    /// The limit less [`FIXED_OVERHEAD`]: what the data and the threads may occupy. The
    /// plan sizes the buckets from it, so it does not depend on the threads (nor does the
    /// output).
    pub fn working_memory(&self) -> u64 {
        self.memory_limit_bytes.saturating_sub(FIXED_OVERHEAD)
    }

    /// The threads a conversion runs on: [`ConvertOptions::threads`], but no more than
    /// whose own memory ([`THREAD_MEMORY`] each) takes half the working memory, so that
    /// the rest still holds a bucket the plan sized (it sizes them for two in flight):
    /// 32 threads under 64 MiB, 16 under the smallest limit, 2016 under 2 GiB.
    pub fn threads_within_limit(&self) -> usize {
        let fitting = (self.working_memory() / 2 / THREAD_MEMORY).max(1);
        self.threads
            .min(usize::try_from(fitting).unwrap_or(usize::MAX))
    }

    /// What the units of a phase may lease together: the working memory less the memory
    /// of the [threads they run on](ConvertOptions::threads_within_limit).
    pub fn unit_memory(&self) -> u64 {
        self.working_memory()
            .saturating_sub(self.threads_within_limit() as u64 * THREAD_MEMORY)
    }

    /// Each scatter unit's share of the units' memory less its decoding memory.
    fn scatter_share(&self) -> u64 {
        (self.unit_memory() / self.threads_within_limit() as u64)
            .saturating_sub(SCATTER_DECODE_MEMORY)
            .max(MIN_SPILL_BUFFER)
    }

    /// Bytes each scatter unit buffers with `buckets` buckets: its
    /// [share](ConvertOptions::scatter_share), or more where that leaves less than
    /// [`spill::CHUNK_AIM_BYTES`] a bucket (fewer units then run at once, and the chunks
    /// stay large enough to read back efficiently), but never more than the units' memory
    /// leaves beside one unit's decoding: more buckets then make smaller chunks, not more
    /// memory.
    pub(super) fn scatter_buffer(&self, buckets: u64) -> u64 {
        let room = (self.unit_memory())
            .saturating_sub(SCATTER_DECODE_MEMORY)
            .max(MIN_SPILL_BUFFER);
        (buckets.saturating_mul(spill::CHUNK_AIM_BYTES as u64))
            .max(self.scatter_share())
            .min(room)
    }

    /// The memory one scatter unit leases with `buckets` buckets: its decoding and its
    /// [buffer](ConvertOptions::scatter_buffer).
    pub(super) fn scatter_unit_memory(&self, buckets: u64) -> u64 {
        SCATTER_DECODE_MEMORY + self.scatter_buffer(buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(threads: usize, limit_mib: u64) -> ConvertOptions {
        ConvertOptions {
            threads,
            memory_limit_bytes: limit_mib << 20,
            ..ConvertOptions::default()
        }
    }

    #[test]
    fn threads_are_capped_where_their_own_memory_would_take_over_half_the_working_memory() {
        // (threads asked, limit in MiB) -> threads run: half of (limit - 32 MiB) in 512 KiB.
        for ((threads, limit), expected) in [
            ((64, 64), 32),
            ((32, 64), 32),
            ((2, 64), 2),
            ((64, 48), 16),
            ((1, 48), 1),
            ((4096, 2048), 2016),
            ((128, 4096), 128),
        ] {
            let options = options(threads, limit);
            assert_eq!(
                options.threads_within_limit(),
                expected,
                "{threads} threads under {limit} MiB"
            );
            let threads_memory = expected as u64 * THREAD_MEMORY;
            assert!(threads_memory <= options.working_memory() / 2);
            assert_eq!(
                options.unit_memory(),
                options.working_memory() - threads_memory
            );
        }
    }

    #[test]
    fn the_working_memory_the_plan_reads_does_not_depend_on_the_threads() {
        let one = options(1, 64).working_memory();
        for threads in [2, 16, 64, 1024] {
            assert_eq!(options(threads, 64).working_memory(), one);
        }
        assert_eq!(one, (64 << 20) - FIXED_OVERHEAD);
    }

    #[test]
    fn scatter_units_share_the_units_memory_among_the_threads_they_run_on() {
        // 64 threads under 64 MiB run on 32: each unit's share is of those 32, never of
        // threads that do not run.
        let capped = options(64, 64);
        let asked = options(32, 64);
        assert_eq!(capped.scatter_share(), asked.scatter_share());
        let roomy = options(2, 2048);
        assert_eq!(
            roomy.scatter_share(),
            roomy.unit_memory() / 2 - SCATTER_DECODE_MEMORY
        );
    }

    #[test]
    fn a_scatter_buffer_aims_at_large_chunks_within_the_units_memory() {
        let aim = spill::CHUNK_AIM_BYTES as u64;
        // Few buckets: the unit's share.
        let roomy = options(2, 2048);
        assert_eq!(roomy.scatter_buffer(100), roomy.scatter_share());
        // Many: enough for the aimed chunks, so fewer units run at once.
        let many = options(16, 2048);
        assert!(many.scatter_share() < 20_000 * aim);
        assert_eq!(many.scatter_buffer(20_000), 20_000 * aim);
        // Too many for the limit: all the units' memory beside one unit's decoding.
        let room = many.unit_memory() - SCATTER_DECODE_MEMORY;
        assert_eq!(many.scatter_buffer(1 << 40), room);
        for (threads, limit) in [(1, 48), (2, 64), (64, 64), (16, 512), (128, 2048)] {
            let options = options(threads, limit);
            let mut last = 0;
            for buckets in [1, 10, 1000, 10_000, 100_000, 1 << 30] {
                let buffer = options.scatter_buffer(buckets);
                assert!(buffer >= last, "{threads} threads, {limit} MiB, {buckets}");
                assert!(
                    options.scatter_unit_memory(buckets)
                        <= options
                            .unit_memory()
                            .max(SCATTER_DECODE_MEMORY + MIN_SPILL_BUFFER),
                    "{threads} threads, {limit} MiB, {buckets}"
                );
                last = buffer;
            }
        }
    }
}
