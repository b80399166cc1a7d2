//! The plan of a conversion: parameters, the identity of every input file, and the
//! decisions that follow from them. Computed identically by every task of a distributed
//! conversion, stored once in the work directory, and checked by every later task.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::work::WorkDir;
use super::ConvertOptions;
use crate::error::{Error, IoContext, Result};
use crate::format::checksum;
use crate::format::manifest::{Parameters, SourceFile, Sources, FORMAT_VERSION};
use crate::format::space::check_space;
use crate::source::columns::ParquetSource;
use crate::source::{has_labels, Geometry, InputSet};

/// Estimated shard bytes per pulse (9 per pulse, ~6 per DOM at ~0.4 DOMs per pulse, the
/// event level's share); used only to choose the bucket count.
pub const SHARD_BYTES_PER_PULSE: u64 = 12;
/// Spill bytes per input pulse (measured 13.6 on data with the real statistics: 13 per
/// pulse and 56 per event); used only to check the free space.
pub const SPILL_BYTES_PER_PULSE: u64 = 14;
/// Memory planned per input pulse of a bucket being gathered: `bucket_shard::bucket_memory`
/// leases 64 bytes (decoded pulses, their packed copy, the spill chunk read, what the
/// allocator keeps) and the rest is margin.
pub const GATHER_MEMORY_PER_PULSE: u64 = 96;
/// The most pulses one bucket is planned to hold on average: buckets are filled by a
/// hash, so their sizes vary by a few standard deviations at most, and a shard must stay
/// under 2^31 pulses and DOMs for its I32 offsets ([`crate::format::shard::MAX_SHARD_ITEMS`]).
const MAX_BUCKET_PULSES: u64 = 1 << 29;
/// Buckets the memory limit must let gather at once: while one bucket's shard is being
/// written (bounded by the disk), another is read and packed (bounded by the CPU). With one
/// at a time the two alternate; measured on 1M events under a 512 MiB limit, two in flight
/// took the conversion from 8.1-8.8 to 11.0 M input pulses/s. Fixed, not derived from
/// `--threads`, so the output does not depend on the thread count.
pub const GATHER_BUCKETS_IN_FLIGHT: u64 = 2;

/// Everything decided before the first event is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Layout version of the writer.
    pub format_version: u32,
    /// Parameters, as recorded in the manifest.
    pub parameters: Parameters,
    /// Input files.
    pub sources: Sources,
    /// Whether the meta carries labels.
    pub labels: bool,
    /// Whether every coordinate of the geometry is exact in `f32`.
    pub geometry_fits_f32: bool,
    /// Whether every sensor id of the geometry fits `i16`.
    pub sensor_fits_i16: bool,
    /// Pulses in all batch files (rows).
    pub total_pulses: u64,
    /// Whether the meta is split by batch before the scatter (see `meta_split`).
    #[serde(default)]
    pub meta_split: bool,
}

fn file_size(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path).at(path)?.len())
}

/// XXH3 of a Parquet file's footer (metadata + length + magic): a cheap content identity.
fn footer_fingerprint(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).at(path)?;
    let size = file.metadata().at(path)?.len();
    if size < 8 {
        return Err(Error::parquet(
            path,
            parquet::errors::ParquetError::EOF("file shorter than a Parquet footer".into()),
        ));
    }
    let mut tail = [0u8; 8];
    file.seek(SeekFrom::Start(size - 8)).at(path)?;
    file.read_exact(&mut tail).at(path)?;
    let footer_len = u32::from_le_bytes(tail[..4].try_into().expect("4 bytes")) as u64 + 8;
    let footer_len = footer_len.min(size);
    let mut footer = vec![0u8; footer_len as usize];
    file.seek(SeekFrom::Start(size - footer_len)).at(path)?;
    file.read_exact(&mut footer).at(path)?;
    Ok(checksum::of_bytes(&footer))
}

fn parquet_source(path: &Path, batch_id: Option<i64>) -> Result<SourceFile> {
    let rows = ParquetSource::open(path)?.num_rows();
    Ok(SourceFile {
        path: path.display().to_string(),
        bytes: file_size(path)?,
        rows: Some(rows),
        batch_id,
        fingerprint: footer_fingerprint(path)?,
    })
}

impl Plan {
    /// Reads the footers of every input and the geometry, and decides the bucket count.
    pub fn build(inputs: &InputSet, options: &ConvertOptions) -> Result<(Plan, Geometry)> {
        options.validate()?;
        let geometry = Geometry::read(&inputs.geometry)?;
        let batches = inputs
            .batches
            .par_iter()
            .map(|b| parquet_source(&b.path, Some(b.batch_id)))
            .collect::<Result<Vec<_>>>()?;
        let meta = inputs
            .meta
            .iter()
            .map(|m| parquet_source(m, None))
            .collect::<Result<Vec<_>>>()?;
        let labels = has_labels(&inputs.meta)?;
        let total_pulses: u64 = batches.iter().filter_map(|b| b.rows).sum();
        let bucket_pulses = (options.shard_target_bytes / SHARD_BYTES_PER_PULSE)
            .min(options.working_memory() / (GATHER_MEMORY_PER_PULSE * GATHER_BUCKETS_IN_FLIGHT))
            .clamp(1, MAX_BUCKET_PULSES);
        let bucket_count = total_pulses.div_ceil(bucket_pulses).max(1);
        let plan = Plan {
            format_version: FORMAT_VERSION,
            parameters: Parameters {
                seed: options.seed,
                bucket_count,
                shard_target_bytes: options.shard_target_bytes,
                memory_limit_bytes: options.memory_limit_bytes,
                lossy: options.lossy,
                layout: options.layout,
            },
            sources: Sources {
                batches,
                meta,
                geometry: SourceFile {
                    path: inputs.geometry.display().to_string(),
                    bytes: file_size(&inputs.geometry)?,
                    rows: None,
                    batch_id: None,
                    fingerprint: checksum::of_file(&inputs.geometry)?,
                },
            },
            labels,
            geometry_fits_f32: geometry.fits_f32(),
            sensor_fits_i16: geometry.max_sensor_id() <= i16::MAX as usize,
            total_pulses,
            meta_split: super::meta_split::worth_splitting(inputs)?,
        };
        Ok((plan, geometry))
    }

    /// This plan with its sources' paths left out ([`Sources::by_content`]): what every run
    /// of one conversion must agree on.
    fn by_content(&self) -> Plan {
        Plan {
            sources: self.sources.by_content(),
            ..self.clone()
        }
    }

    /// Stores the plan in `work`, or checks it against the one stored by an earlier task
    /// (inputs read from another place are the same inputs if they hold the same).
    pub fn store_or_check(&self, work: &WorkDir) -> Result<()> {
        let path = work.plan_file();
        if path.exists() {
            let stored: Plan = work.read_json(&path)?;
            if let Some(difference) = difference(&stored.by_content(), &self.by_content()) {
                return Err(Error::manifest(
                    &path,
                    format!(
                        "an unfinished conversion with other inputs or parameters is in {}: \
                         {difference}; rerun with the same inputs and parameters, or remove \
                         that directory",
                        work.out().display()
                    ),
                ));
            }
            return Ok(());
        }
        work.write_json(&path, self)
    }

    /// Checks that the filesystem of `out` can hold what the conversion will still write:
    /// the spill files and shards, less what an earlier run of it already wrote there.
    /// Where the free space cannot be read, nothing is checked.
    pub fn check_free_space(&self, out: &Path) -> Result<()> {
        let estimate = self.total_pulses * (SPILL_BYTES_PER_PULSE + SHARD_BYTES_PER_PULSE);
        let needed = estimate.saturating_sub(bytes_under(out));
        check_space(out, needed, "the conversion (spill files and shards)")
    }

    /// The path of batch `batch_id` as given.
    pub fn batch_path(&self, batch_id: i64) -> &str {
        self.sources
            .batches
            .iter()
            .find(|b| b.batch_id == Some(batch_id))
            .map_or("?", |b| b.path.as_str())
    }
}

/// Bytes of the files under `dir` (an unfinished conversion's), 0 where unreadable.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&entry.path()),
            _ => entry.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// How `there` (what a directory holds) and `here` (what this run would make) differ, as
/// "`field` is X there and Y here" for the first field that does; `None` where they
/// serialise alike.
pub(super) fn difference<T: Serialize>(there: &T, here: &T) -> Option<String> {
    let as_json = |value: &T| serde_json::to_value(value).expect("plans and manifests serialise");
    first_difference(&as_json(there), &as_json(here))
        .map(|(field, there, here)| format!("`{field}` is {there} there and {here} here"))
}

/// The first field (a dotted path) whose value differs between `a` and `b`, with both
/// values.
fn first_difference(
    a: &serde_json::Value,
    b: &serde_json::Value,
) -> Option<(String, String, String)> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            let (u, v) = (
                x.get(k).unwrap_or(&Value::Null),
                y.get(k).unwrap_or(&Value::Null),
            );
            first_difference(u, v).map(|(field, p, q)| {
                let joined = match field.chars().next() {
                    None => k.clone(),
                    Some('[') => format!("{k}{field}"),
                    Some(_) => format!("{k}.{field}"),
                };
                (joined, p, q)
            })
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (u, v))| {
                first_difference(u, v).map(|(field, p, q)| match field.is_empty() {
                    true => (format!("[{i}]"), p, q),
                    false => (format!("[{i}].{field}"), p, q),
                })
            })
        }
        _ if a == b => None,
        _ => Some((String::new(), a.to_string(), b.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_is_named_by_its_field() {
        let a = serde_json::json!({"parameters": {"seed": 1, "lossy": false}, "sources": {"batches": [{"path": "/a/batch_1.parquet"}]}});
        let mut b = a.clone();
        b["sources"]["batches"][0]["path"] = "/b/batch_1.parquet".into();
        assert_eq!(
            first_difference(&a, &b),
            Some((
                "sources.batches[0].path".into(),
                "\"/a/batch_1.parquet\"".into(),
                "\"/b/batch_1.parquet\"".into()
            ))
        );
        assert_eq!(first_difference(&a, &a), None);
    }
}
