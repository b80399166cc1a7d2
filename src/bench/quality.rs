//! Shuffle quality of a stream of batches: what a loader gives up in randomness.
//!
//! Each metric comes with its value for an ideal loader (i.i.d. uniform batches), so a
//! report can say how far a loader is from it:
//! - **file mixing**: mean Shannon entropy (bits) of the source-file mix inside a batch,
//!   divided by the same for i.i.d. batches of the same sizes (1.0 is ideal; a loader that
//!   reads one file at a time scores near 0);
//! - **label autocorrelation**: Pearson correlation of the zenith label of consecutive
//!   events along the stream (0 is ideal; neighbours in the source are correlated);
//! - **pair repeat**: of all the pairs of events that share a batch in one epoch, the
//!   fraction that share a batch again in the next epoch, against `(B - 1) / (N - 1)` for
//!   i.i.d.;
//! - **displacement**: mean distance between an event's position in the stream and its
//!   stored position, as a fraction of the dataset size (1/3 for a uniform permutation);
//! - **padded fill**: what a sequence model that cuts events to [`PADDED_FILL_CUT`] pulses
//!   and pads each batch to its longest event computes on: pulses over the grid's cells (1
//!   without padding). Not a randomness figure: batches grouped by length
//!   (`group_by_length`) trade some randomness for it.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::rng::Rng;

/// What the metrics need to know of one delivered event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EventInfo {
    /// Event id.
    pub event_id: i64,
    /// The source file it came from (batch id).
    pub source_file: i64,
    /// Zenith label (NaN without labels).
    pub zenith: f64,
    /// Its position in stored order (0..N).
    pub stored_position: u64,
    /// Its pulses.
    pub pulses: u64,
}

/// The pulses events are cut to for [`padded_fill`]: the Kaggle competition's transformers
/// took 192 to 256 in training.
pub const PADDED_FILL_CUT: u64 = 256;

/// The shuffle-quality figures of a loader.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quality {
    /// Mean in-batch source-file entropy / the same for i.i.d. batches (1 is ideal).
    pub file_mixing: f64,
    /// Lag-1 autocorrelation of zenith along the stream (0 is ideal); `None` without labels.
    pub label_autocorrelation: Option<f64>,
    /// Fraction of same-batch pairs of epoch e that share a batch again in epoch e+1.
    pub pair_repeat: f64,
    /// The i.i.d. expectation of `pair_repeat`.
    pub pair_repeat_iid: f64,
    /// Mean |stream position - stored position| / N (1/3 for a uniform permutation).
    pub displacement: f64,
    /// Pulses over the cells of the batches padded to their longest event, events cut to
    /// [`PADDED_FILL_CUT`] pulses (1 without padding).
    pub padded_fill: f64,
}

fn entropy_bits(counts: impl Iterator<Item = usize>, total: usize) -> f64 {
    counts
        .filter(|&c| c > 0)
        .map(|c| {
            let p = c as f64 / total as f64;
            -p * p.log2()
        })
        .sum()
}

fn mean_batch_entropy(batches: &[Vec<i64>]) -> f64 {
    let mut sum = 0.0;
    for batch in batches {
        // Ordered: the entropy's terms are summed in the same order every run.
        let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
        for &f in batch {
            *counts.entry(f).or_default() += 1;
        }
        sum += entropy_bits(counts.into_values(), batch.len());
    }
    sum / batches.len().max(1) as f64
}

/// File mixing of `epoch` (see the module docs); the i.i.d. reference is drawn with a fixed
/// seed from the epoch's own file distribution.
pub fn file_mixing(epoch: &[Vec<EventInfo>]) -> f64 {
    let files: Vec<Vec<i64>> = epoch
        .iter()
        .map(|b| b.iter().map(|e| e.source_file).collect())
        .collect();
    let all: Vec<i64> = files.iter().flatten().copied().collect();
    if all.is_empty() {
        return 0.0;
    }
    let mut rng = Rng::new(0x5eed);
    let iid: Vec<Vec<i64>> = files
        .iter()
        .map(|b| {
            (0..b.len())
                .map(|_| all[rng.below(all.len() as u64) as usize])
                .collect()
        })
        .collect();
    let ideal = mean_batch_entropy(&iid);
    if ideal == 0.0 {
        return 1.0;
    }
    mean_batch_entropy(&files) / ideal
}

/// Lag-1 autocorrelation of the zenith label along the stream; `None` without labels.
pub fn label_autocorrelation(epoch: &[Vec<EventInfo>]) -> Option<f64> {
    let z: Vec<f64> = epoch.iter().flatten().map(|e| e.zenith).collect();
    if z.len() < 3 || z.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mean = z.iter().sum::<f64>() / z.len() as f64;
    let var: f64 = z.iter().map(|v| (v - mean).powi(2)).sum();
    if var == 0.0 {
        return None;
    }
    let cov: f64 = z.windows(2).map(|w| (w[0] - mean) * (w[1] - mean)).sum();
    Some(cov / var)
}

/// Pair repeat between two epochs and its i.i.d. expectation, over every pair of events
/// that share a batch of the first epoch (so the order inside a batch does not matter):
/// a batch whose events fall `c_1, c_2, ...` to a batch of the second epoch contributes
/// `sum c_k (c_k - 1) / 2` repeats out of `B (B - 1) / 2` pairs.
pub fn pair_repeat(first: &[Vec<EventInfo>], second: &[Vec<EventInfo>]) -> (f64, f64) {
    let batch_of: HashMap<i64, usize> = second
        .iter()
        .enumerate()
        .flat_map(|(k, b)| b.iter().map(move |e| (e.event_id, k)))
        .collect();
    let (mut pairs, mut repeats) = (0u64, 0u64);
    let mut later: Vec<usize> = Vec::new();
    for batch in first {
        let b = batch.len() as u64;
        pairs += b * b.saturating_sub(1) / 2;
        later.clear();
        later.extend(batch.iter().filter_map(|e| batch_of.get(&e.event_id)));
        later.sort_unstable();
        for group in later.chunk_by(|a, b| a == b) {
            let c = group.len() as u64;
            repeats += c * (c - 1) / 2;
        }
    }
    let n: usize = second.iter().map(Vec::len).sum();
    let mean_batch = n as f64 / second.len().max(1) as f64;
    let iid = if n > 1 {
        (mean_batch - 1.0) / (n as f64 - 1.0)
    } else {
        0.0
    };
    (repeats as f64 / pairs.max(1) as f64, iid)
}

/// Mean displacement from stored order, as a fraction of the stream length.
pub fn displacement(epoch: &[Vec<EventInfo>]) -> f64 {
    let n: usize = epoch.iter().map(Vec::len).sum();
    let total: f64 = epoch
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| (i as f64 - e.stored_position as f64).abs())
        .sum();
    total / (n.max(1) as f64).powi(2)
}

/// Padded fill of `epoch` (see the module docs): events cut to `cut` pulses, each batch
/// padded to its longest.
pub fn padded_fill(epoch: &[Vec<EventInfo>], cut: u64) -> f64 {
    let (mut pulses, mut cells) = (0u64, 0u64);
    for batch in epoch {
        let cut_pulses = batch.iter().map(|e| e.pulses.min(cut));
        pulses += cut_pulses.clone().sum::<u64>();
        cells += batch.len() as u64 * cut_pulses.max().unwrap_or(0);
    }
    if cells == 0 {
        return 1.0;
    }
    pulses as f64 / cells as f64
}

/// All metrics from two consecutive epochs of one loader.
pub fn quality(first: &[Vec<EventInfo>], second: &[Vec<EventInfo>]) -> Quality {
    let (pair_repeat, pair_repeat_iid) = pair_repeat(first, second);
    Quality {
        file_mixing: file_mixing(first),
        label_autocorrelation: label_autocorrelation(first),
        pair_repeat,
        pair_repeat_iid,
        displacement: displacement(first),
        padded_fill: padded_fill(first, PADDED_FILL_CUT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(order: &[u64], files: u64, batch: usize) -> Vec<Vec<EventInfo>> {
        let n = order.len() as u64;
        order
            .chunks(batch)
            .map(|c| {
                c.iter()
                    .map(|&i| EventInfo {
                        event_id: i as i64,
                        source_file: (i * files / n) as i64,
                        zenith: (i as f64 / n as f64) * 3.0,
                        stored_position: i,
                        pulses: 1 + i % 300,
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn sequential_is_poor_and_shuffled_is_near_ideal() {
        let n = 20_000u64;
        let sequential: Vec<u64> = (0..n).collect();
        let mut shuffled = sequential.clone();
        Rng::new(1).shuffle(&mut shuffled);
        let mut shuffled2 = sequential.clone();
        Rng::new(2).shuffle(&mut shuffled2);
        let (seq, shf, shf2) = (
            stream(&sequential, 20, 100),
            stream(&shuffled, 20, 100),
            stream(&shuffled2, 20, 100),
        );
        let poor = quality(&seq, &seq);
        let good = quality(&shf, &shf2);
        assert!(poor.file_mixing < 0.1, "{poor:?}");
        assert!(good.file_mixing > 0.95, "{good:?}");
        assert!(poor.label_autocorrelation.unwrap() > 0.99);
        assert!(good.label_autocorrelation.unwrap().abs() < 0.05);
        assert_eq!(
            poor.pair_repeat, 1.0,
            "the same order every epoch repeats every pair"
        );
        assert!(good.pair_repeat < 0.02 && (good.pair_repeat_iid - 99.0 / 19_999.0).abs() < 1e-9);
        assert!(poor.displacement < 1e-9);
        assert!((good.displacement - 1.0 / 3.0).abs() < 0.02, "{good:?}");
    }

    #[test]
    fn padded_fill_counts_the_cut_pulses_over_the_padded_cells() {
        // Pulses 1 + i % 300: batches of 100 sorted by length pad less than shuffled ones.
        let mut by_length: Vec<u64> = (0..600).collect();
        by_length.sort_by_key(|&i| (1 + i % 300, i));
        let sorted = stream(&by_length, 1, 100);
        // Batch k holds pulse counts 50k+1..=50k+50 twice, cut at 256: padded to 50k+50.
        let fill = padded_fill(&sorted, 256);
        let pulses: u64 = (0..600u64).map(|i| (1 + i % 300).min(256)).sum();
        let cells: u64 = (0..6u64).map(|k| 100 * (50 * k + 50).min(256)).sum();
        assert_eq!(fill, pulses as f64 / cells as f64);
        let shuffled: Vec<u64> = {
            let mut order: Vec<u64> = (0..600).collect();
            Rng::new(3).shuffle(&mut order);
            order
        };
        assert!(
            padded_fill(&stream(&shuffled, 1, 100), 256) < 0.6 && fill > 0.85,
            "{fill}"
        );
        assert_eq!(padded_fill(&[], 256), 1.0, "no batch, no padding");
    }

    #[test]
    fn pair_repeat_counts_every_pair_whatever_the_order_in_a_batch() {
        let info = |ids: &[u64]| -> Vec<EventInfo> { stream(ids, 1, ids.len())[0].clone() };
        // 6 pairs in the first epoch's batch; {1,2} and {3,4} share a batch again.
        let first = vec![info(&[1, 2, 3, 4])];
        let second = vec![info(&[1, 2]), info(&[3, 4])];
        assert_eq!(pair_repeat(&first, &second).0, 2.0 / 6.0);
        let reordered = vec![info(&[3, 1, 4, 2])];
        assert_eq!(pair_repeat(&reordered, &second).0, 2.0 / 6.0);
    }
}
