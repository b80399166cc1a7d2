//! The sampler's command-line flags, shared by `shardify order` and `shardbench`.

use shardify::sampler::{BatchOrder, EventLength, LengthGrouping};

/// Order and batching flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplerArgs {
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Events per batch.
    #[arg(long, default_value_t = 256)]
    pub batch_events: usize,
    /// Events per block.
    #[arg(long, default_value_t = 256)]
    pub block_events: usize,
    /// Consecutive events drawn together inside a window.
    #[arg(long, default_value_t = 1)]
    pub run_events: usize,
    /// Events inside a batch in stored order (ascending reads) or as the shuffle drew them.
    #[arg(long, default_value_t = BatchOrder::Stored)]
    pub batch_order: BatchOrder,
    /// Batches of events of similar length inside each window; with CAP, lengths above CAP
    /// count as CAP (the length a model cuts events to).
    #[arg(long, value_name = "CAP", num_args = 0..=1)]
    pub group_by_length: Option<Option<usize>>,
    /// What --group-by-length counts: pulses (sequence models) or doms (DOM-level models,
    /// the padded layout).
    #[arg(long, default_value = "pulses", requires = "group_by_length")]
    pub length_of: EventLength,
}

impl SamplerArgs {
    /// `--group-by-length` as the sampler takes it.
    pub fn length_grouping(&self) -> LengthGrouping {
        self.group_by_length.map_or(LengthGrouping::Off, |cap| {
            LengthGrouping::of(self.length_of, cap)
        })
    }
}
