//! # shardify
//!
//! Rewrites IceCube Kaggle Parquet files (`batch_N.parquet`, meta, `sensor_geometry.csv`)
//! into pre-shuffled, DOM-packed safetensors shards with a checksummed manifest, and reads
//! them back.
//!
//! The modules follow the data: [`source`] (input) -> [`pack`] (DOM packing) ->
//! [`format`](mod@format) (shards, manifest) -> [`convert`] (the two-pass external shuffle) ->
//! [`dataset`] (reading shards back: inspect, dump, verify). Training jobs read through
//! [`sampler`] (block-shuffle order, batching, ranks) -> [`batch`] (layouts, gather) ->
//! [`pipeline`] (worker threads, in-order delivery) -> [`device`] (staging memory, CUDA
//! copies); a loader that holds the whole dataset in (GPU) memory takes its order from
//! [`resident`] (an epoch's batches as flat arrays) instead. (The `bench` and `synth` modules serve this repository's benches, tests and
//! tools, and are left out of these docs.)
//!
//! Quickstart: convert the committed fixtures, then stream one epoch of shuffled batches.
//!
//! ```
//! use std::sync::Arc;
//! use shardify::convert::{convert, ConvertOptions, Phase, Silent, TaskSlice};
//! use shardify::dataset::{ChecksumPolicy, Dataset};
//! use shardify::pipeline::{Loader, LoaderConfig};
//! use shardify::sampler::SamplerState;
//! use shardify::source::InputSet;
//! # fn main() -> shardify::Result<()> {
//! # let tmp = tempfile::tempdir().unwrap();
//! # let out = tmp.path().join("ds");
//! let inputs = InputSet::discover("fixtures/kaggle-mini".as_ref(), Some("train"))?;
//! let options = ConvertOptions { seed: 7, ..ConvertOptions::default() };
//! convert(&inputs, &out, &options, Phase::All, TaskSlice::default(), &Silent)?;
//!
//! let dataset = Arc::new(Dataset::open(&out, ChecksumPolicy::Lazy)?);
//! let mut loader = Loader::new(dataset, LoaderConfig::default(), SamplerState::start(0))?;
//! let mut events = 0;
//! while let Some(batch) = loader.next() {
//!     let batch = batch?;                       // an error names the shard; never a hang
//!     let packed = batch.packed().unwrap();     // event_dom_offsets, pulse_time, ...
//!     assert_eq!(packed.event_dom_offsets[0], 0);
//!     events += batch.plan().events.len();
//! }
//! assert_eq!(events, 300);                      // every event of the epoch, once
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod batch;
// Measurement and synthetic data: public for the binaries, benches and tests of this
// repository, not part of the API a training job uses, so left out of the docs.
#[doc(hidden)]
pub mod bench;
pub mod convert;
pub mod cores;
pub mod dataset;
pub mod device;
pub mod error;
pub mod event;
pub mod format;
pub mod pack;
pub mod pipeline;
pub mod prefetch;
pub mod resident;
#[doc(hidden)]
pub mod rng;
pub mod sampler;
pub mod source;
#[doc(hidden)]
pub mod synth;

pub use error::{Error, Result};
