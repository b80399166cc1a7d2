//! `shardify inspect`: what a dataset holds, with the shape of its heavy tails.

use serde::Serialize;

use super::Dataset;
use crate::error::Result;

/// Order statistics of a per-event count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    /// Smallest.
    pub min: u64,
    /// Median (lower middle).
    pub median: u64,
    /// Mean.
    pub mean: f64,
    /// 99th percentile (nearest rank).
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

impl Distribution {
    /// The statistics of `values` (sorted in place); zeros when empty.
    pub fn of(values: &mut [u32]) -> Distribution {
        if values.is_empty() {
            return Distribution {
                min: 0,
                median: 0,
                mean: 0.0,
                p99: 0,
                max: 0,
            };
        }
        values.sort_unstable();
        let n = values.len();
        let rank = |q: f64| values[((q * n as f64).ceil() as usize).clamp(1, n) - 1] as u64;
        Distribution {
            min: values[0] as u64,
            median: values[(n - 1) / 2] as u64,
            mean: values.iter().map(|&v| v as f64).sum::<f64>() / n as f64,
            p99: rank(0.99),
            max: values[n - 1] as u64,
        }
    }
}

/// What `inspect` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// Events.
    pub events: u64,
    /// DOMs.
    pub doms: u64,
    /// Pulses.
    pub pulses: u64,
    /// Shards.
    pub shards: usize,
    /// Bytes of all shards.
    pub bytes: u64,
    /// Pulses per event.
    pub pulses_per_event: Distribution,
    /// DOMs per event.
    pub doms_per_event: Distribution,
    /// Pulses per DOM.
    pub pulses_per_dom: Distribution,
    /// Fraction of DOMs with a single pulse.
    pub single_pulse_dom_fraction: f64,
}

/// Reads every shard and summarises the dataset.
pub fn inspect(dataset: &Dataset) -> Result<Inspection> {
    let (mut pulses_per_event, mut doms_per_event, mut pulses_per_dom) =
        (Vec::new(), Vec::new(), Vec::new());
    for i in 0..dataset.shard_count() {
        let view = dataset.shard(i)?.view()?;
        for e in 0..view.events() {
            let doms = view.dom_range(e);
            doms_per_event.push(doms.len() as u32);
            let pulses = view.dom_pulse_offsets[doms.end] - view.dom_pulse_offsets[doms.start];
            pulses_per_event.push(pulses as u32);
        }
        pulses_per_dom.extend(
            view.dom_pulse_offsets
                .windows(2)
                .map(|w| (w[1] - w[0]) as u32),
        );
    }
    let single = pulses_per_dom.iter().filter(|&&p| p == 1).count();
    let m = dataset.manifest();
    Ok(Inspection {
        events: m.totals.events,
        doms: m.totals.doms,
        pulses: m.totals.pulses,
        shards: m.shards.len(),
        bytes: m.totals.bytes,
        single_pulse_dom_fraction: single as f64 / pulses_per_dom.len().max(1) as f64,
        pulses_per_event: Distribution::of(&mut pulses_per_event),
        doms_per_event: Distribution::of(&mut doms_per_event),
        pulses_per_dom: Distribution::of(&mut pulses_per_dom),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_statistics() {
        let mut v: Vec<u32> = (1..=100).rev().collect();
        let d = Distribution::of(&mut v);
        assert_eq!((d.min, d.median, d.p99, d.max), (1, 50, 99, 100));
        assert_eq!(d.mean, 50.5);
    }
}
