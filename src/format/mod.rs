//! The on-disk format, the vocabulary shared by the writer ([`crate::convert`]) and the
//! readers ([`crate::dataset`]): the safetensors container, tensor names, shards, the
//! sensor table, the manifest, the shuffle order, checksums and atomic writes.

pub mod atomic;
pub mod checksum;
pub mod chunked;
pub mod columns;
pub mod lock;
pub mod manifest;
pub mod names;
pub mod order;
pub mod pod;
pub mod records;
pub mod safetensors;
pub mod sensor_table;
pub mod shard;
pub mod space;

use std::collections::BTreeMap;

pub use columns::{FloatColumn, IntColumn};
pub use manifest::{Manifest, MANIFEST_FILE};
pub use records::{RecordView, ShardLayout, StoredView};
pub use sensor_table::{LookupRows, SensorTable, SensorTableEntry, SENSOR_TABLE_FILE};
pub use shard::{ShardEntry, ShardProblem, ShardView, StorageTypes, Validation};

/// The value of `format` in the manifest and in every file's `__metadata__`.
pub const FORMAT: &str = "shardify";
/// The version of the shard layout and manifest written by this crate. Version 2 stores
/// positions once per dataset (the sensor table) and offsets as I32; version 1 stored a
/// position per DOM and I64 offsets.
pub const FORMAT_VERSION: u32 = 2;

/// `extra` plus the `format` and `format_version` entries every file's `__metadata__`
/// carries.
pub fn format_metadata(mut extra: BTreeMap<String, String>) -> BTreeMap<String, String> {
    extra.insert("format".into(), FORMAT.into());
    extra.insert("format_version".into(), FORMAT_VERSION.to_string());
    extra
}
