//! `shardify generate` (and the `shardify-gen` binary, the same arguments): writes a
//! synthetic dataset in the exact Kaggle "IceCube - Neutrinos in Deep Ice" layout and
//! schema, of any size, for fixtures, benches and trying the loader without the download.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueEnum};
use shardify::synth::{write_dataset, Codec, Profile, SynthOptions, REAL_MAX_EVENT_PULSES};

#[derive(Clone, Copy, ValueEnum)]
enum ProfileArg {
    /// The real training set's statistics (median ~62, mean ~160 pulses per event,
    /// ~0.39 DOMs per pulse, 75% single-pulse DOMs).
    Real,
    /// The older, lighter shape of the committed fixtures.
    Simple,
}

/// `shardify generate`'s (and `shardify-gen`'s) arguments.
#[derive(Args)]
pub(crate) struct GenerateArgs {
    /// Output directory (created; a split or meta already there is never overwritten; the
    /// split appears whole when done, never part of it).
    out: PathBuf,
    /// Events in all.
    #[arg(long, default_value_t = 1000)]
    events: u64,
    /// Batch files.
    #[arg(long, default_value_t = 2)]
    files: u32,
    /// `train` (labels) or `test` (no labels).
    #[arg(long, default_value = "train")]
    split: String,
    /// Batch id of the first file.
    #[arg(long, default_value_t = 1)]
    first_batch_id: i64,
    /// Compression codec.
    #[arg(long, default_value = "snappy", value_parser = codec_parser())]
    codec: Codec,
    /// Rows per row group (default: one row group per file, as in the originals).
    #[arg(long)]
    row_group_rows: Option<usize>,
    /// One meta file per batch (SPLIT_meta/batch_N.parquet).
    #[arg(long)]
    meta_per_batch: bool,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The shape of the events.
    #[arg(long, value_enum, default_value = "real")]
    profile: ProfileArg,
    /// The most pulses one event gets, in the real profile.
    #[arg(long, default_value_t = REAL_MAX_EVENT_PULSES)]
    max_event_pulses: usize,
}

/// `--codec`: one of [`Codec::NAMED`]'s names (listed in `--help` and in the error for any
/// other).
fn codec_parser() -> impl TypedValueParser<Value = Codec> {
    PossibleValuesParser::new(Codec::NAMED.map(|(name, _)| name))
        .map(|name| Codec::named(&name).expect("a name PossibleValuesParser accepted"))
}

/// Writes the dataset, then its summary on stdout.
pub(crate) fn run_generate(args: GenerateArgs) -> Result<()> {
    if !["train", "test"].contains(&args.split.as_str()) {
        anyhow::bail!("--split must be train or test");
    }
    let options = SynthOptions {
        events: args.events,
        files: args.files,
        split: args.split,
        first_batch_id: args.first_batch_id,
        codec: args.codec,
        row_group_rows: args.row_group_rows,
        meta_per_batch: args.meta_per_batch,
        seed: args.seed,
        profile: match args.profile {
            ProfileArg::Real => Profile::Real {
                max_event_pulses: args.max_event_pulses,
            },
            ProfileArg::Simple => Profile::Simple,
        },
    };
    let started = std::time::Instant::now();
    let summary = write_dataset(&args.out, &options)
        .with_context(|| format!("writing {}", args.out.display()))?;
    say!(
        "wrote {} events, {} pulses in {} files to {} ({:.1} s)",
        summary.events,
        summary.pulses,
        summary.batch_files.len(),
        args.out.display(),
        started.elapsed().as_secs_f64()
    )
    .context("writing the summary to stdout")?;
    Ok(())
}
