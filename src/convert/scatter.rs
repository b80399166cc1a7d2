//! Pass 1: one batch file -> one spill file of events tagged with their shuffle key,
//! grouped in chunks by bucket.

use super::plan::Plan;
use super::spill::{SpillIndex, SpillWriter};
use super::work::WorkDir;
use std::os::unix::fs::FileExt;

use crate::error::{Error, IoContext, Result};
use crate::event::ValueRange;
use crate::format::atomic::{write_atomic, Durability};
use crate::format::checksum;
use crate::format::order::{bucket_of, shuffle_key};
use crate::source::{scan_batch, BatchInput, Geometry, InputSet};

/// Whether the scatter unit of `batch_id` has finished: its index exists and its spill file
/// has the recorded size.
pub fn is_done(work: &WorkDir, batch_id: i64) -> Result<bool> {
    let index_path = work.spill_index(batch_id);
    if !index_path.exists() {
        return Ok(false);
    }
    let index: SpillIndex = work.read_json(&index_path)?;
    Ok(std::fs::metadata(work.spill_file(batch_id)).is_ok_and(|m| m.len() == index.spill_bytes))
}

/// Whether a unit left by an earlier run can be skipped: [`is_done`] and every chunk of its
/// spill file intact (spill data is not fsynced, so after a machine crash it may not be).
/// A damaged unit's index is removed, so the unit runs again.
pub fn is_done_and_intact(work: &WorkDir, batch_id: i64) -> Result<bool> {
    if !is_done(work, batch_id)? {
        return Ok(false);
    }
    let index_path = work.spill_index(batch_id);
    let index: SpillIndex = work.read_json(&index_path)?;
    let spill = work.spill_file(batch_id);
    if chunks_intact(&spill, &index) {
        return Ok(true);
    }
    tracing::warn!(
        "{}: damaged; scattering batch {batch_id} again",
        spill.display()
    );
    std::fs::remove_file(&index_path).at(&index_path)?;
    Ok(false)
}

fn chunks_intact(spill: &std::path::Path, index: &SpillIndex) -> bool {
    let Ok(file) = std::fs::File::open(spill) else {
        return false;
    };
    let mut buf = Vec::new();
    index.chunks.iter().all(|c| {
        buf.resize(c.len as usize, 0);
        file.read_exact_at(&mut buf, c.offset).is_ok() && checksum::value_of_bytes(&buf) == c.xxh3
    })
}

/// Scatters one batch file; `budget` bounds the bytes buffered in memory.
pub fn scatter_batch(
    plan: &Plan,
    inputs: &InputSet,
    input: &BatchInput,
    geometry: &Geometry,
    work: &WorkDir,
    budget: usize,
) -> Result<SpillIndex> {
    let meta = super::meta_split::batch_meta(work, inputs, input.batch_id, plan.labels)?;
    let buckets = plan.parameters.bucket_count;
    let seed = plan.parameters.seed;
    let spill_path = work.spill_file(input.batch_id);
    let mut range = ValueRange::default();
    let (mut events, mut pulses) = (0u64, 0u64);
    // Spill files are temporary and every chunk is checksummed: no fsync (see `is_done`).
    let (chunks, spill_bytes) = write_atomic(&spill_path, Durability::Temporary, |out| {
        let mut writer = SpillWriter::new(out, buckets as usize, budget);
        scan_batch(input, &meta, geometry, |event| {
            let key = shuffle_key(seed, event.header().event_id);
            range.observe(event);
            events += 1;
            pulses += event.len() as u64;
            writer
                .push(bucket_of(key, buckets) as usize, key, event)
                .map_err(|e| Error::io(&spill_path, e))
        })?;
        writer.finish().map_err(|e| Error::io(&spill_path, e))
    })?;
    let index = SpillIndex {
        batch_id: input.batch_id,
        events,
        pulses,
        spill_bytes,
        range,
        chunks,
    };
    work.write_json(&work.spill_index(input.batch_id), &index)?;
    Ok(index)
}
