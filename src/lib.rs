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
//! ```no_run
//! use shardify::convert::{convert, ConvertOptions, Phase, Silent, TaskSlice};
//! use shardify::source::InputSet;
//! # fn main() -> shardify::Result<()> {
//! let inputs = InputSet::discover("fixtures/kaggle-mini".as_ref(), Some("train"))?;
//! let options = ConvertOptions { seed: 7, ..ConvertOptions::default() };
//! convert(&inputs, "out".as_ref(), &options, Phase::All, TaskSlice::default(), &Silent)?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod batch;
// Measurement and synthetic data: public for the binaries, benches and tests of this
// repository, not part of the API a training job uses, so left out of the docs.
#[doc(hidden)]
pub mod bench;
pub mod convert;
pub mod dataset;
pub mod device;
pub mod error;
pub mod event;
pub mod format;
pub mod pack;
pub mod pipeline;
mod prefetch;
pub mod resident;
#[doc(hidden)]
pub mod rng;
pub mod sampler;
pub mod source;
#[doc(hidden)]
pub mod synth;

pub use error::{Error, Result};
