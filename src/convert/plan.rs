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

/// The buckets (and shards) of `pulses` input pulses: each holds what a shard of the
/// target size holds, or less where [`GATHER_BUCKETS_IN_FLIGHT`] of them would not fit the
/// working memory.
pub fn bucket_count(pulses: u64, options: &ConvertOptions) -> u64 {
    let bucket_pulses = (options.shard_target_bytes / SHARD_BYTES_PER_PULSE)
        .min(options.working_memory() / (GATHER_MEMORY_PER_PULSE * GATHER_BUCKETS_IN_FLIGHT))
        .clamp(1, MAX_BUCKET_PULSES);
    pulses.div_ceil(bucket_pulses).max(1)
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
        let bucket_count = bucket_count(total_pulses, options);
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
/// "`field` is X there and Y here" for each field that does, the first
/// [`SHOWN_DIFFERENCES`] of them then how many more, so that the setting a user changed is
/// named even where a setting derived from it sorts first (the bucket count from the shard
/// size); `None` where they serialise alike.
pub(super) fn difference<T: Serialize>(there: &T, here: &T) -> Option<String> {
    let as_json = |value: &T| serde_json::to_value(value).expect("plans and manifests serialise");
    let mut found = Vec::new();
    differences(&as_json(there), &as_json(here), "", &mut found);
    if found.is_empty() {
        return None;
    }
    let mut text = found
        .iter()
        .take(SHOWN_DIFFERENCES)
        .map(Difference::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if found.len() > SHOWN_DIFFERENCES {
        text += &format!("; and {} more", found.len() - SHOWN_DIFFERENCES);
    }
    Some(text)
}

/// The differing fields [`difference`] names before it counts the rest.
const SHOWN_DIFFERENCES: usize = 4;

/// A value shown in a difference longer than this is cut (a whole list of inputs).
const SHOWN_VALUE_CHARS: usize = 100;

/// One field (a dotted path) whose value differs, with both values as shown.
#[derive(Debug, PartialEq, Eq)]
struct Difference {
    field: String,
    there: String,
    here: String,
    /// Lists of different lengths: `there` and `here` are their lengths.
    lengths: bool,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Difference {
            field, there, here, ..
        } = self;
        match self.lengths {
            true => write!(f, "`{field}` has {there} entries there and {here} here"),
            false => write!(f, "`{field}` is {there} there and {here} here"),
        }
    }
}

/// Every field under `path` whose value differs between `a` and `b`, in field order
/// (objects by key, arrays by index; arrays of different lengths by their lengths).
fn differences(
    a: &serde_json::Value,
    b: &serde_json::Value,
    path: &str,
    found: &mut Vec<Difference>,
) {
    use serde_json::Value;
    let field = |name: &str| match path {
        "" => name.to_string(),
        _ => format!("{path}.{name}"),
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort_unstable();
            keys.dedup();
            for k in keys {
                let (u, v) = (x.get(k), y.get(k));
                differences(
                    u.unwrap_or(&Value::Null),
                    v.unwrap_or(&Value::Null),
                    &field(k),
                    found,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(u, v, &format!("{path}[{i}]"), found);
            }
        }
        (Value::Array(x), Value::Array(y)) => found.push(Difference {
            field: path.to_string(),
            there: x.len().to_string(),
            here: y.len().to_string(),
            lengths: true,
        }),
        _ if a == b => {}
        _ => found.push(Difference {
            field: path.to_string(),
            there: shown_value(a),
            here: shown_value(b),
            lengths: false,
        }),
    }
}

/// `value` as JSON, cut to [`SHOWN_VALUE_CHARS`].
fn shown_value(value: &serde_json::Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(SHOWN_VALUE_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
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
            difference(&a, &b).as_deref(),
            Some(
                "`sources.batches[0].path` is \"/a/batch_1.parquet\" there and \
                 \"/b/batch_1.parquet\" here"
            )
        );
        assert_eq!(difference(&a, &a), None);
    }

    #[test]
    fn every_difference_is_named_up_to_a_count() {
        let a = serde_json::json!({"parameters": {"bucket_count": 4, "seed": 42, "layout": "columns"}, "sources": {"batches": [1, 2, 3]}});
        let mut b = a.clone();
        b["parameters"]["bucket_count"] = 1.into();
        b["parameters"]["seed"] = 43.into();
        assert_eq!(
            difference(&a, &b).as_deref(),
            Some(
                "`parameters.bucket_count` is 4 there and 1 here; \
                 `parameters.seed` is 42 there and 43 here"
            ),
            "the seed the user changed is named, not only the derived bucket count"
        );
        b["sources"]["batches"] = serde_json::json!([1]);
        b["parameters"]["layout"] = "records".into();
        b["parameters"]["lossy"] = true.into();
        assert_eq!(
            difference(&a, &b).as_deref(),
            Some(
                "`parameters.bucket_count` is 4 there and 1 here; \
                 `parameters.layout` is \"columns\" there and \"records\" here; \
                 `parameters.lossy` is null there and true here; \
                 `parameters.seed` is 42 there and 43 here; and 1 more"
            )
        );
        let long = serde_json::json!({"path": "x".repeat(500)});
        let text = difference(&long, &serde_json::json!({"path": "y"})).unwrap();
        assert!(text.len() < 200 && text.contains("xxx..."), "{text}");
        let lists = (
            serde_json::json!({"sources": {"batches": [1, 2, 3]}}),
            serde_json::json!({"sources": {"batches": [1]}}),
        );
        assert_eq!(
            difference(&lists.0, &lists.1).as_deref(),
            Some("`sources.batches` has 3 entries there and 1 here")
        );
    }
}
