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

/// Exact counts of a per-item count, in memory bounded by its distinct values (not by the
/// number of items: a dataset of billions of DOMs has a few thousand distinct pulse counts).
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    /// `small[v]`: items of value `v`, for values below [`Histogram::DENSE`].
    small: Vec<u64>,
    /// Items of each larger value.
    large: std::collections::BTreeMap<u64, u64>,
    items: u64,
    sum: u128,
}

impl Histogram {
    /// Values below this are counted in a dense table.
    pub const DENSE: u64 = 1 << 16;

    /// Counts one item of value `v`.
    pub fn add(&mut self, v: u64) {
        if v < Self::DENSE {
            let i = v as usize;
            if i >= self.small.len() {
                self.small.resize(i + 1, 0);
            }
            self.small[i] += 1;
        } else {
            *self.large.entry(v).or_default() += 1;
        }
        self.items += 1;
        self.sum += v as u128;
    }

    /// Items counted.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// Items of value `v`.
    pub fn count(&self, v: u64) -> u64 {
        let count = if v < Self::DENSE {
            self.small.get(v as usize)
        } else {
            self.large.get(&v)
        };
        count.copied().unwrap_or(0)
    }

    /// Values with their counts, ascending.
    fn values(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (self.small.iter().enumerate())
            .filter(|(_, &c)| c > 0)
            .map(|(v, &c)| (v as u64, c))
            .chain(self.large.iter().map(|(&v, &c)| (v, c)))
    }

    /// The value of 1-based rank `rank` in ascending order.
    fn at_rank(&self, rank: u64) -> u64 {
        let mut seen = 0;
        for (v, c) in self.values() {
            seen += c;
            if seen >= rank {
                return v;
            }
        }
        0
    }

    /// The order statistics; zeros when empty.
    pub fn distribution(&self) -> Distribution {
        let n = self.items;
        if n == 0 {
            return Distribution {
                min: 0,
                median: 0,
                mean: 0.0,
                p99: 0,
                max: 0,
            };
        }
        Distribution {
            min: self.at_rank(1),
            median: self.at_rank((n - 1) / 2 + 1),
            mean: self.sum as f64 / n as f64,
            p99: self.at_rank(((0.99 * n as f64).ceil() as u64).clamp(1, n)),
            max: self.at_rank(n),
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
    let (mut pulses_per_event, mut doms_per_event, mut pulses_per_dom) = (
        Histogram::default(),
        Histogram::default(),
        Histogram::default(),
    );
    for i in 0..dataset.shard_count() {
        let view = dataset.shard(i)?.view()?;
        for e in 0..view.events() {
            let doms = view.dom_range(e);
            doms_per_event.add(doms.len() as u64);
            pulses_per_event.add(view.event_pulse_range(e).len() as u64);
        }
        for w in view.dom_pulse_offsets.windows(2) {
            pulses_per_dom.add((w[1] - w[0]) as u64);
        }
    }
    let single = pulses_per_dom.count(1);
    let m = dataset.manifest();
    Ok(Inspection {
        events: m.totals.events,
        doms: m.totals.doms,
        pulses: m.totals.pulses,
        shards: m.shards.len(),
        bytes: m.totals.bytes,
        single_pulse_dom_fraction: single as f64 / pulses_per_dom.items().max(1) as f64,
        pulses_per_event: pulses_per_event.distribution(),
        doms_per_event: doms_per_event.distribution(),
        pulses_per_dom: pulses_per_dom.distribution(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_statistics() {
        let mut h = Histogram::default();
        for v in (1..=100).rev() {
            h.add(v);
        }
        let d = h.distribution();
        assert_eq!((d.min, d.median, d.p99, d.max), (1, 50, 99, 100));
        assert_eq!(d.mean, 50.5);
        assert_eq!(Histogram::default().distribution().max, 0);
    }

    #[test]
    fn large_values_and_repeats_count_exactly() {
        let mut h = Histogram::default();
        for v in [5, 5, 5, 178_000, 70_000, 1] {
            h.add(v);
        }
        let d = h.distribution();
        assert_eq!((d.min, d.median, d.p99, d.max), (1, 5, 178_000, 178_000));
        assert_eq!((h.count(5), h.count(70_000), h.count(6)), (3, 1, 0));
        assert_eq!(h.items(), 6);
    }
}
