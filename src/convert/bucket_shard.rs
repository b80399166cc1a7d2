//! Pass 2: one bucket -> one shard. Reads the bucket's chunks from every spill file, sorts
//! its events by shuffle key (the global order), rejects duplicate event ids, DOM-packs
//! the events and writes the shard.

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::bucket_chunks::{BucketChunks, SpillFiles};
use super::plan::Plan;
use super::relayout::rewrite_file;
use super::shard_writer::{write_shard, ShardContents};
use super::spill::{BucketEvents, SpillIndex};
use super::work::WorkDir;
use crate::error::{Error, IoContext, Result};
use crate::event::{EventHeader, ValueRange};
use crate::format::atomic::TEMP_PREFIX;
use crate::format::safetensors::Dtype;
use crate::format::{checksum, format_metadata, ShardEntry, ShardLayout, StorageTypes};
use crate::pack::{fit_capacity, PackedColumns, Packer};
use crate::prefetch::prefetch;

/// What became of a bucket (the marker of a finished gather unit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketRecord {
    /// The bucket.
    pub bucket: u64,
    /// Its shard; `None` when no event fell in the bucket.
    pub shard: Option<ShardEntry>,
}

/// Column widths for the whole dataset, from the plan and every batch's value ranges.
pub fn storage_types(plan: &Plan, indexes: &[SpillIndex]) -> StorageTypes {
    let range = indexes
        .iter()
        .map(|i| i.range)
        .fold(ValueRange::default(), ValueRange::merge);
    let lossy = plan.parameters.lossy;
    StorageTypes {
        sensor_id: if plan.sensor_fits_i16 {
            Dtype::I16
        } else {
            Dtype::I32
        },
        position: if plan.geometry_fits_f32 || lossy {
            Dtype::F32
        } else {
            Dtype::F64
        },
        time: if range.time_fits_i32() {
            Dtype::I32
        } else {
            Dtype::I64
        },
        charge: if range.charge_fits_f32 || lossy {
            Dtype::F32
        } else {
            Dtype::F64
        },
        labels: plan.labels,
    }
}

/// Whether the gather unit of `bucket` has finished: its record exists and its shard has
/// the recorded size.
pub fn is_done(work: &WorkDir, bucket: u64) -> Result<bool> {
    Ok(done_record(work, bucket)?.is_some())
}

fn done_record(work: &WorkDir, bucket: u64) -> Result<Option<BucketRecord>> {
    let path = work.bucket_record(bucket);
    if !path.exists() {
        return Ok(None);
    }
    let record: BucketRecord = work.read_json(&path)?;
    let present = record.shard.as_ref().is_none_or(|shard| {
        std::fs::metadata(work.out().join(&shard.file)).is_ok_and(|m| m.len() == shard.bytes)
    });
    Ok(present.then_some(record))
}

/// Whether a unit left by an earlier run can be skipped: [`is_done`] and its shard's
/// checksum right (shards are fsynced only at finalize, so after a machine crash one may not
/// be). A damaged unit's record is removed, so the unit runs again.
pub fn is_done_and_intact(work: &WorkDir, bucket: u64) -> Result<bool> {
    let Some(record) = done_record(work, bucket)? else {
        return Ok(false);
    };
    let intact = record.shard.as_ref().is_none_or(|shard| {
        checksum::of_file(&work.out().join(&shard.file)).is_ok_and(|sum| sum == shard.xxh3)
    });
    if !intact {
        tracing::warn!("bucket {bucket}: shard damaged; gathering it again");
        let path = work.bucket_record(bucket);
        std::fs::remove_file(&path).at(&path)?;
    }
    Ok(intact)
}

/// Estimated peak memory in bytes of gathering a bucket's `chunks`: decoded pulses and their packed
/// copy (~21 bytes each), per-event records, and the largest chunk read at once, plus what
/// the allocator keeps of them (measured: ~50 bytes per pulse resident for one bucket, and
/// a quarter more with two gathered at once).
pub fn bucket_memory(chunks: &BucketChunks) -> u64 {
    let totals = chunks.totals();
    events_memory(totals.pulses, totals.events) + totals.largest_chunk
}

/// The part of [`bucket_memory`] that grows with a bucket's `pulses` and `events`.
pub fn events_memory(pulses: u64, events: u64) -> u64 {
    pulses * 64 + events * 160
}

/// Buffers that one gather reuses for the next bucket: memory touched for the first time
/// costs far more than the copies themselves.
#[derive(Default)]
pub struct GatherScratch {
    events: BucketEvents,
    read: Vec<u8>,
    order: Vec<u32>,
    headers: Vec<EventHeader>,
    parts: Vec<(Packer, PackedColumns)>,
}

/// Gathers `bucket`, whose `chunks` lie in `spills`, into its shard, packing on the
/// threads of the current rayon pool.
pub fn gather_bucket(
    plan: &Plan,
    bucket: u64,
    chunks: &BucketChunks,
    spills: &SpillFiles,
    types: StorageTypes,
    scratch: &mut GatherScratch,
) -> Result<BucketRecord> {
    let work = spills.work();
    let events = &mut scratch.events;
    events.clear();
    let totals = chunks.totals();
    events.reserve(totals.events as usize, totals.pulses as usize);
    scratch.read.clear();
    fit_capacity(&mut scratch.read, totals.largest_chunk as usize);
    for (at, batch_chunks) in chunks.by_batch() {
        spills.with_spill(at, |path, file| {
            batch_chunks
                .iter()
                .try_for_each(|chunk| events.read_chunk(path, file, chunk, &mut scratch.read))
        })?;
    }
    let record = if events.records.is_empty() {
        BucketRecord {
            bucket,
            shard: None,
        }
    } else {
        BucketRecord {
            bucket,
            shard: Some(write_bucket_shard(plan, bucket, types, work, scratch)?),
        }
    };
    work.write_json(&work.bucket_record(bucket), &record)?;
    Ok(record)
}

/// Events ahead of the one being packed whose pulses are prefetched.
const PREFETCH_AHEAD: usize = 4;

/// Events per packing part below which splitting the work is not worth it.
const MIN_EVENTS_PER_PART: usize = 4096;

fn write_bucket_shard(
    plan: &Plan,
    bucket: u64,
    types: StorageTypes,
    work: &WorkDir,
    scratch: &mut GatherScratch,
) -> Result<ShardEntry> {
    let GatherScratch {
        events,
        order,
        headers,
        parts,
        ..
    } = scratch;
    let records = &events.records;
    order.clear();
    order.extend(0..records.len() as u32);
    let sort_key = |&i: &u32| {
        let (key, h, _) = &records[i as usize];
        (*key, h.event_id, h.batch_id, h.first_row)
    };
    order.par_sort_unstable_by_key(sort_key);
    for pair in order.windows(2) {
        let (a, b) = (&records[pair[0] as usize].1, &records[pair[1] as usize].1);
        if a.event_id == b.event_id {
            return Err(Error::DuplicateEvent {
                event_id: a.event_id,
                first: plan.batch_path(a.batch_id).into(),
                first_row: a.first_row,
                second: plan.batch_path(b.batch_id).into(),
                second_row: b.first_row,
            });
        }
    }
    headers.clear();
    headers.extend(order.iter().map(|&i| records[i as usize].1));
    // Contiguous runs of the sorted events are packed in parallel; the shard holds their
    // concatenation, which is the same bytes whatever the number of parts.
    let part_count = rayon::current_num_threads()
        .min(order.len().div_ceil(MIN_EVENTS_PER_PART))
        .max(1);
    parts.resize_with(part_count.max(parts.len()), Default::default);
    let per_part = order.len().div_ceil(part_count);
    let pulses = &events.pulses;
    parts[..part_count]
        .par_iter_mut()
        .zip(order.par_chunks(per_part))
        .for_each(|((packer, packed), run)| {
            packed.clear();
            let run_pulses: usize = run.iter().map(|&i| records[i as usize].2.len()).sum();
            packed.reserve(run.len(), run_pulses, run_pulses);
            for (k, &i) in run.iter().enumerate() {
                // Events come in shuffled order: fetch a later one's pulses ahead.
                if let Some(&ahead) = run.get(k + PREFETCH_AHEAD) {
                    let p = pulses.slice(records[ahead as usize].2.clone());
                    prefetch(p.sensor_id);
                    prefetch(p.time);
                    prefetch(p.charge);
                    prefetch(p.auxiliary);
                }
                packer.pack(pulses.slice(records[i as usize].2.clone()), packed);
            }
        });
    let packed: Vec<PackedColumns> = parts[..part_count]
        .iter_mut()
        .map(|(_, p)| std::mem::take(p))
        .collect();
    let metadata = format_metadata(BTreeMap::from([
        ("shard".to_string(), bucket.to_string()),
        ("seed".to_string(), plan.parameters.seed.to_string()),
        ("events".to_string(), headers.len().to_string()),
        (
            "doms".to_string(),
            packed.iter().map(|p| p.doms()).sum::<usize>().to_string(),
        ),
        (
            "pulses".to_string(),
            packed.iter().map(|p| p.pulses()).sum::<usize>().to_string(),
        ),
    ]));
    let contents = ShardContents {
        headers,
        parts: &packed,
        types,
        metadata,
    };
    let target = work.out().join(WorkDir::shard_name(bucket));
    let entry = match plan.parameters.layout {
        ShardLayout::Columns => write_shard(&target, &contents),
        // Written as columns under a temp name first, then again as records from that
        // file's validated view: one writer of records, whatever wrote the columns.
        ShardLayout::Records => {
            let name = format!("{TEMP_PREFIX}columns.{}", WorkDir::shard_name(bucket));
            let columns = work.out().join(name);
            write_shard(&columns, &contents).and_then(|_| {
                let written = rewrite_file(&columns, &target, ShardLayout::Records);
                let removed = std::fs::remove_file(&columns).at(&columns);
                written.and_then(|entry| removed.map(|_| entry))
            })
        }
    };
    for ((_, slot), columns) in parts.iter_mut().zip(packed) {
        *slot = columns;
    }
    entry
}
