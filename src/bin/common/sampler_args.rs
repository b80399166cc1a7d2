//! The sampler's command-line flags, shared by `shardify order` and `shardbench`.

use shardify::sampler::{BatchOrder, Batching, EventLength, LengthGrouping};

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
    #[arg(long, value_name = "CAP", num_args = 0..=1, value_parser = length_cap)]
    pub group_by_length: Option<Option<usize>>,
    /// What --group-by-length counts: pulses (sequence models) or doms (DOM-level models,
    /// the padded layout).
    #[arg(long, default_value = "pulses", requires = "group_by_length")]
    pub length_of: EventLength,
    /// Batch by a budget of padded tokens instead of --batch-events (which then sizes only
    /// shardbench's baselines): events times the batch's longest length, as
    /// --group-by-length counts and caps it (which it needs).
    #[arg(long, group = "budget", requires = "group_by_length")]
    pub max_tokens: Option<usize>,
    /// Batch by a budget of pulses instead of --batch-events (which then sizes only
    /// shardbench's baselines): each batch takes events, as drawn, while their pulses fit
    /// (the nodes of a GNN's graph batch).
    #[arg(long, group = "budget", conflicts_with = "group_by_length")]
    pub max_pulses: Option<usize>,
    /// With --max-pulses: each event counts at most this many of its pulses toward the
    /// budget (the pulses a model that cuts events to this many keeps).
    #[arg(long, requires = "max_pulses")]
    pub pulse_cap: Option<usize>,
    /// With a budget (--max-tokens or --max-pulses): events per batch at most.
    #[arg(long, requires = "budget")]
    pub max_events: Option<usize>,
    /// With --max-tokens: count each batch's longest length rounded up to a multiple of
    /// MULTIPLE (at most the --group-by-length CAP), as a model that pads its grids so pads
    /// them.
    #[arg(long, value_name = "MULTIPLE", requires = "max_tokens")]
    pub pad_to_multiple_of: Option<usize>,
}

/// `--group-by-length`'s CAP: a count. The value after the flag is taken as its CAP, so a
/// dataset written there (`--group-by-length DATASET`) is refused saying so.
fn length_cap(value: &str) -> Result<usize, String> {
    value.parse().map_err(|_| {
        format!(
            "`{value}` is not a length: the value after --group-by-length is its CAP (a count \
             of pulses or DOMs); write the dataset before the flag, or --group-by-length=CAP"
        )
    })
}

impl SamplerArgs {
    /// `--max-tokens` or `--max-pulses` (with `--max-events`), else `--batch-events`.
    pub fn batching(&self) -> Batching {
        match (self.max_tokens, self.max_pulses) {
            (Some(max_tokens), _) => Batching::Tokens {
                max_tokens,
                max_events: self.max_events,
                pad_to_multiple_of: self.pad_to_multiple_of,
            },
            (None, Some(max_pulses)) => Batching::Pulses {
                max_pulses,
                max_events: self.max_events,
                pulse_cap: self.pulse_cap,
            },
            (None, None) => Batching::Events(self.batch_events),
        }
    }

    /// `--group-by-length` as the sampler takes it.
    pub fn length_grouping(&self) -> LengthGrouping {
        self.group_by_length.map_or(LengthGrouping::Off, |cap| {
            LengthGrouping::of(self.length_of, cap)
        })
    }
}
