//! Pass 1: one batch file -> one spill file of events tagged with their shuffle key,
//! grouped in chunks by bucket.

use super::chunk_table::ChunkTable;
use super::plan::Plan;
use super::spill::{read_checked_chunk, SpillIndex, SpillWriter};
use super::work::WorkDir;
use std::fs::File;

use crate::error::{Error, IoContext, Result};
use crate::event::ValueRange;
use crate::format::atomic::{write_atomic, write_bytes_atomic, Durability};
use crate::format::order::{bucket_of, shuffle_key};
use crate::source::{scan_batch, BatchInput, Geometry, InputSet};

/// Whether the scatter unit of `batch_id` has finished: its index exists, and its spill file
/// and chunk table have the recorded sizes. An index this version cannot read (written by an
/// older one, whose indexes listed the chunks themselves) is a unit to run again.
pub fn is_done(work: &WorkDir, batch_id: i64) -> Result<bool> {
    Ok(done_index(work, batch_id)?.is_some())
}

fn done_index(work: &WorkDir, batch_id: i64) -> Result<Option<SpillIndex>> {
    let index_path = work.spill_index(batch_id);
    if !index_path.exists() {
        return Ok(None);
    }
    let index: SpillIndex = match work.read_json(&index_path) {
        Ok(index) => index,
        Err(Error::Manifest { problem, .. }) => {
            tracing::warn!(
                "{}: {problem}; scattering batch {batch_id} again",
                index_path.display()
            );
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let has_size =
        |path: std::path::PathBuf, bytes| std::fs::metadata(path).is_ok_and(|m| m.len() == bytes);
    let present = has_size(work.spill_file(batch_id), index.spill_bytes)
        && has_size(work.chunk_table(batch_id), index.table.bytes());
    Ok(present.then_some(index))
}

/// Whether a unit left by an earlier run can be skipped: [`is_done`], its chunk table
/// intact, and every chunk of its spill file intact (spill data is not fsynced, so after a
/// machine crash it may not be). A damaged unit's index is removed, so the unit runs again.
pub fn is_done_and_intact(work: &WorkDir, batch_id: i64) -> Result<bool> {
    let Some(index) = done_index(work, batch_id)? else {
        return Ok(false);
    };
    if let Err(e) = check_chunks(work, &index) {
        tracing::warn!("{e}; scattering batch {batch_id} again");
        let index_path = work.spill_index(batch_id);
        std::fs::remove_file(&index_path).at(&index_path)?;
        return Ok(false);
    }
    Ok(true)
}

/// Checks the chunk table of `index`'s batch and every chunk it lists against their
/// checksums.
fn check_chunks(work: &WorkDir, index: &SpillIndex) -> Result<()> {
    let (spill, table) = (
        work.spill_file(index.batch_id),
        work.chunk_table(index.batch_id),
    );
    let spill_file = File::open(&spill).at(&spill)?;
    let table_file = File::open(&table).at(&table)?;
    let mut buf = Vec::new();
    index.table.check_each(&table, &table_file, |chunk| {
        read_checked_chunk(&spill, &spill_file, chunk, &mut buf)
    })
}

/// Scatters one batch file, buffering at most `buffer` bytes of its events in memory.
pub fn scatter_batch(
    plan: &Plan,
    inputs: &InputSet,
    input: &BatchInput,
    geometry: &Geometry,
    work: &WorkDir,
    buffer: usize,
) -> Result<SpillIndex> {
    let meta = super::meta_split::batch_meta(work, inputs, input.batch_id, plan.labels)?;
    let buckets = plan.parameters.bucket_count;
    let seed = plan.parameters.seed;
    let spill_path = work.spill_file(input.batch_id);
    let mut range = ValueRange::default();
    let (mut events, mut pulses) = (0u64, 0u64);
    // Spill files are temporary and every chunk is checksummed: no fsync (see `is_done`).
    let (mut chunks, spill_bytes) = write_atomic(&spill_path, Durability::Temporary, |out| {
        let mut writer = SpillWriter::new(out, buffer);
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
    let (table, table_bytes) = ChunkTable::encode(&mut chunks, buckets, spill_bytes);
    // Durable before the index that marks the unit done (unlike the spill file, whose
    // chunks carry their own checksums): the gather trusts it.
    write_bytes_atomic(&work.chunk_table(input.batch_id), &table_bytes)?;
    let index = SpillIndex {
        batch_id: input.batch_id,
        events,
        pulses,
        spill_bytes,
        range,
        table,
    };
    work.write_json(&work.spill_index(input.batch_id), &index)?;
    Ok(index)
}
