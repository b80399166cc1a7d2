//! `shardify inspect`: what a dataset holds, with the shape of its heavy tails.

use serde::Serialize;

use super::Dataset;
use crate::error::Result;
use crate::format::names::{self, Level};
use crate::format::safetensors::{Dtype, Header};
use crate::format::StoredView;

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
    /// Where the bytes go.
    pub bytes_by_level: ByteBudget,
}

/// Bytes by level of the layout, measured from the shards' headers, beside what format
/// version 1 stored for the same events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ByteBudget {
    /// Bytes of the `event_*` tensors of all shards.
    pub event_bytes: u64,
    /// Bytes of the `dom_*` tensors.
    pub dom_bytes: u64,
    /// Bytes of the `pulse_*` tensors.
    pub pulse_bytes: u64,
    /// Shard headers and their padding.
    pub header_bytes: u64,
    /// The sensor table (`geometry.safetensors`), stored once.
    pub sensor_table_bytes: u64,
    /// `event_bytes` per event.
    pub bytes_per_event: f64,
    /// `dom_bytes` per DOM.
    pub bytes_per_dom: f64,
    /// `pulse_bytes` per pulse.
    pub bytes_per_pulse: f64,
    /// Everything (shards and the sensor table) per pulse.
    pub total_bytes_per_pulse: f64,
    /// What format version 1 stored for the same events: I64 offsets and a position per
    /// DOM (at the sensor table's width) in every shard, and no sensor table.
    pub v1_bytes: u64,
    /// `v1_bytes` per pulse.
    pub v1_bytes_per_pulse: f64,
}

impl ByteBudget {
    /// Adds a shard's tensors (`file_bytes` long, described by `header`; `view` splits a
    /// records shard's records into the levels their pieces belong to).
    fn add_shard(&mut self, header: &Header, file_bytes: u64, view: &StoredView) {
        let mut data = 0;
        for (name, tensor) in &header.tensors {
            let bytes = tensor.range.len() as u64;
            data += bytes;
            if let (names::EVENT_RECORDS, StoredView::Records(v)) = (name.as_str(), view) {
                let w = v.widths;
                self.event_bytes += (v.events() * w.header()) as u64;
                self.dom_bytes += (v.doms() * w.per_dom()) as u64;
                self.pulse_bytes += (v.pulses() * w.per_pulse()) as u64;
                continue;
            }
            match names::level(name) {
                Level::Event => self.event_bytes += bytes,
                Level::Dom => self.dom_bytes += bytes,
                Level::Pulse => self.pulse_bytes += bytes,
            }
        }
        self.header_bytes += file_bytes - data;
    }

    /// The per-item figures, and version 1's size, for these counts.
    fn finish(mut self, counts: [u64; 3], shards: u64, position: Dtype) -> Self {
        let [events, doms, pulses] = counts;
        let per = |bytes: u64, items: u64| bytes as f64 / items.max(1) as f64;
        self.bytes_per_event = per(self.event_bytes, events);
        self.bytes_per_dom = per(self.dom_bytes, doms);
        self.bytes_per_pulse = per(self.pulse_bytes, pulses);
        let total = self.event_bytes
            + self.dom_bytes
            + self.pulse_bytes
            + self.header_bytes
            + self.sensor_table_bytes;
        self.total_bytes_per_pulse = per(total, pulses);
        // Version 1: both offset arrays at 8 bytes instead of 4, and x, y, z per DOM.
        let wider_offsets = 4 * (events + doms + 2 * shards);
        self.v1_bytes =
            total - self.sensor_table_bytes + wider_offsets + 3 * position.size() as u64 * doms;
        self.v1_bytes_per_pulse = per(self.v1_bytes, pulses);
        self
    }
}

/// Reads every shard and summarises the dataset.
pub fn inspect(dataset: &Dataset) -> Result<Inspection> {
    let (mut pulses_per_event, mut doms_per_event, mut pulses_per_dom) = (
        Histogram::default(),
        Histogram::default(),
        Histogram::default(),
    );
    let mut budget = ByteBudget::default();
    for i in 0..dataset.shard_count() {
        let shard = dataset.shard(i)?;
        budget.add_shard(shard.header(), shard.bytes().len() as u64, &shard.stored()?);
        let columns = shard.columns()?;
        let view = columns.view();
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
    budget.sensor_table_bytes = m.sensor_table.bytes;
    let counts = [m.totals.events, m.totals.doms, m.totals.pulses];
    let budget = budget.finish(counts, m.shards.len() as u64, m.schema.types.position);
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
        bytes_by_level: budget,
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
