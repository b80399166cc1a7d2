//! The on-disk format: safetensors shards, the manifest, checksums and atomic writes.

pub mod atomic;
pub mod checksum;
pub mod manifest;
pub mod order;
pub mod pod;
pub mod safetensors;
pub mod shard;

pub use manifest::{Manifest, MANIFEST_FILE};
pub use shard::{ShardEntry, ShardView, StorageTypes};
