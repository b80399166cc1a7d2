//! Pass 2: one bucket -> one shard. Reads the bucket's chunks from every spill file, sorts
//! its events by shuffle key (the global order), rejects duplicate event ids, DOM-packs
//! the events and writes the shard.

use std::collections::BTreeMap;
use std::fs::File;

use serde::{Deserialize, Serialize};

use super::plan::Plan;
use super::spill::{BucketEvents, SpillIndex};
use super::work::WorkDir;
use crate::error::{Error, IoContext, Result};
use crate::event::{EventHeader, ValueRange};
use crate::format::manifest::FORMAT_VERSION;
use crate::format::safetensors::Dtype;
use crate::format::shard::{write_shard, ShardContents};
use crate::format::{ShardEntry, StorageTypes};
use crate::pack::{PackedColumns, Packer};
use crate::source::Geometry;

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

/// Whether the gather unit of `bucket` finished in an earlier run.
pub fn is_done(work: &WorkDir, bucket: u64) -> Result<bool> {
    let path = work.bucket_record(bucket);
    if !path.exists() {
        return Ok(false);
    }
    let record: BucketRecord = work.read_json(&path)?;
    Ok(match record.shard {
        None => true,
        Some(shard) => {
            std::fs::metadata(work.out().join(&shard.file)).is_ok_and(|m| m.len() == shard.bytes)
        }
    })
}

/// Bytes of spill that `bucket` reads: what its memory use scales with.
pub fn bucket_spill_bytes(indexes: &[SpillIndex], bucket: u64) -> u64 {
    indexes
        .iter()
        .flat_map(|i| &i.chunks)
        .filter(|c| c.bucket == bucket)
        .map(|c| c.len)
        .sum()
}

/// Gathers `bucket` into its shard.
pub fn gather_bucket(
    plan: &Plan,
    bucket: u64,
    indexes: &[SpillIndex],
    geometry: &Geometry,
    types: StorageTypes,
    work: &WorkDir,
) -> Result<BucketRecord> {
    let mut events = BucketEvents::default();
    let mut scratch = Vec::new();
    for index in indexes {
        let mut chunks = index
            .chunks
            .iter()
            .filter(|c| c.bucket == bucket)
            .peekable();
        if chunks.peek().is_none() {
            continue;
        }
        let path = work.spill_file(index.batch_id);
        let file = File::open(&path).at(&path)?;
        for chunk in chunks {
            events.read_chunk(&path, &file, chunk, &mut scratch)?;
        }
    }
    drop(scratch);
    let record = if events.records.is_empty() {
        BucketRecord {
            bucket,
            shard: None,
        }
    } else {
        BucketRecord {
            bucket,
            shard: Some(write_bucket_shard(
                plan, bucket, &events, geometry, types, work,
            )?),
        }
    };
    work.write_json(&work.bucket_record(bucket), &record)?;
    Ok(record)
}

fn write_bucket_shard(
    plan: &Plan,
    bucket: u64,
    events: &BucketEvents,
    geometry: &Geometry,
    types: StorageTypes,
    work: &WorkDir,
) -> Result<ShardEntry> {
    let records = &events.records;
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_unstable_by_key(|&i| {
        (
            records[i].0,
            records[i].1.event_id,
            records[i].1.batch_id,
            records[i].1.first_row,
        )
    });
    for pair in order.windows(2) {
        let (a, b) = (&records[pair[0]].1, &records[pair[1]].1);
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
    let mut packed = PackedColumns::default();
    let mut packer = Packer::default();
    let mut headers: Vec<EventHeader> = Vec::with_capacity(order.len());
    for &i in &order {
        let (_, header, range) = &records[i];
        packer.pack(events.pulses.slice(range.clone()), &mut packed);
        headers.push(*header);
    }
    let metadata = BTreeMap::from([
        ("format".to_string(), "shardify".to_string()),
        ("format_version".to_string(), FORMAT_VERSION.to_string()),
        ("shard".to_string(), bucket.to_string()),
        ("seed".to_string(), plan.parameters.seed.to_string()),
        ("events".to_string(), packed.events().to_string()),
        ("doms".to_string(), packed.doms().to_string()),
        ("pulses".to_string(), packed.pulses().to_string()),
    ]);
    let contents = ShardContents {
        headers: &headers,
        packed: &packed,
        geometry,
        types,
        metadata,
    };
    write_shard(&work.out().join(WorkDir::shard_name(bucket)), &contents)
}
