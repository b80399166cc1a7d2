//! `verify --against`: every source pulse in the dataset exactly once, unchanged, with its
//! event's lineage and labels.
//!
//! Memory stays proportional to the number of batch files, not events (132M events would
//! need ~10 GB of per-event state), and the meta is read in bounded memory
//! ([`MetaByBatch`]: per batch, or in passes of at most
//! [`META_PASS_BYTES`](crate::source::meta::META_PASS_BYTES)): the dataset pass sums one
//! digest per event into its lineage batch ([`BatchDigests`]); each source batch is then digested the same way and
//! compared. Only a batch whose digests differ is compared event by event (its dataset
//! events gathered in one more pass over the shards), which names each event that is
//! missing, extra, or different; after [`DETAILED_BATCHES`] such batches the others are
//! reported by counts alone. A batch wholly absent from one side (the source's with no
//! event in the dataset, the dataset's with none in the source: other inputs than the
//! dataset was made from) is one problem, not one per event.

use std::collections::HashMap;

use rayon::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

use super::{Dataset, VerifyReport};
use crate::error::Result;
use crate::event::{EventHeader, RawEvent};
use crate::format::ShardView;
use crate::source::meta::MetaByBatch;
use crate::source::{has_labels, scan_batch, BatchInput, BatchMeta, Geometry, InputSet};

/// Mismatching batches compared event by event; further ones are reported by counts.
pub const DETAILED_BATCHES: usize = 8;

/// The most source batches digested at once: each holds its meta rows (8 MB for a Kaggle
/// batch of 200k events) and its decoding buffers (about 13 MiB), so at most about 340 MB,
/// beside the meta's passes, whatever the cores.
pub const BATCHES_AT_ONCE: usize = 16;

/// Order-independent fingerprint of an event's pulses: their count and the wrapping sum
/// of one hash per pulse, so that it does not depend on the packing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct PulsePrint {
    pub(super) count: u64,
    sum: u64,
}

impl PulsePrint {
    fn add(&mut self, sensor: i64, time: i64, charge: f64, aux: bool) {
        let mut bytes = [0u8; 25];
        bytes[..8].copy_from_slice(&sensor.to_le_bytes());
        bytes[8..16].copy_from_slice(&time.to_le_bytes());
        bytes[16..24].copy_from_slice(&charge.to_bits().to_le_bytes());
        bytes[24] = aux as u8;
        self.count += 1;
        self.sum = self.sum.wrapping_add(xxh3_64(&bytes));
    }
}

impl PulsePrint {
    /// Adds the pulses of stored DOM `d`.
    pub(super) fn add_dom(&mut self, view: &ShardView, d: usize) {
        let sensor = view.dom_sensor_id.get(d);
        for p in view.pulse_range(d) {
            self.add(
                sensor,
                view.pulse_time.get(p),
                view.pulse_charge.get(p),
                view.pulse_auxiliary[p] != 0,
            );
        }
    }
}

/// The fingerprint of stored event `e`.
fn event_print(view: &ShardView, e: usize) -> PulsePrint {
    let mut print = PulsePrint::default();
    for d in view.dom_range(e) {
        print.add_dom(view, d);
    }
    print
}

/// The fingerprint of a source event, at the dataset's charge precision.
fn source_print(event: &RawEvent, charge_narrowed: bool) -> PulsePrint {
    let mut print = PulsePrint::default();
    for i in 0..event.len() {
        let charge = if charge_narrowed {
            event.charge[i] as f32 as f64
        } else {
            event.charge[i]
        };
        print.add(
            event.sensor_id[i] as i64,
            event.time[i],
            charge,
            event.auxiliary[i] != 0,
        );
    }
    print
}

/// What identifies an event's contents: id, lineage, labels (as bits) and pulses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EventFacts {
    first_row: u64,
    labels: (u64, u64),
    print: PulsePrint,
}

impl EventFacts {
    fn new(h: &EventHeader, print: PulsePrint) -> EventFacts {
        EventFacts {
            first_row: h.first_row,
            labels: (h.azimuth.to_bits(), h.zenith.to_bits()),
            print,
        }
    }

    fn digest(&self, event_id: i64) -> u64 {
        let words = [
            event_id as u64,
            self.first_row,
            self.labels.0,
            self.labels.1,
            self.print.count,
            self.print.sum,
        ];
        let mut bytes = [0u8; 48];
        for (i, w) in words.iter().enumerate() {
            bytes[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        xxh3_64(&bytes)
    }
}

fn stored_facts(view: &ShardView, e: usize, print: PulsePrint) -> EventFacts {
    EventFacts::new(&view.header(e), print)
}

/// Events and digest sum of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Digest {
    events: u64,
    sum: u64,
}

impl Digest {
    fn add(&mut self, event_id: i64, facts: &EventFacts) {
        self.merge(Digest {
            events: 1,
            sum: facts.digest(event_id),
        });
    }

    /// Adds the events `other` sums (other events) to these.
    fn merge(&mut self, other: Digest) {
        self.events += other.events;
        self.sum = self.sum.wrapping_add(other.sum);
    }
}

/// The dataset's events summed per lineage batch.
#[derive(Debug, Default)]
pub(super) struct BatchDigests(HashMap<i64, Digest>);

impl BatchDigests {
    /// Adds the sums of `other` (of other events) to these.
    pub(super) fn merge(&mut self, other: BatchDigests) {
        for (batch_id, digest) in other.0 {
            self.0.entry(batch_id).or_default().merge(digest);
        }
    }

    /// Adds stored event `e` (whose fingerprint is `print`).
    pub(super) fn add(&mut self, view: &ShardView, e: usize, print: PulsePrint) {
        let batch_id = view.event_batch_id[e];
        self.0
            .entry(batch_id)
            .or_default()
            .add(view.event_id[e], &stored_facts(view, e, print));
    }
}

/// Compares the dataset with `source` (see the module docs).
pub(super) fn compare(
    dataset: &Dataset,
    source: &InputSet,
    geometry: &Geometry,
    charge_narrowed: bool,
    digests: BatchDigests,
    report: &mut VerifyReport,
) -> Result<()> {
    let labels = has_labels(&source.meta)?;
    let ids: Vec<i64> = source.batches.iter().map(|b| b.batch_id).collect();
    let mut metas = MetaByBatch::new(&source.meta, &ids, labels)?;
    let mut comparison = Comparison {
        dataset,
        geometry,
        charge_narrowed,
        digests,
        compared: 0,
        detailed: 0,
        report,
    };
    // As many batches as threads are digested at once (at most BATCHES_AT_ONCE), then
    // compared in batch order.
    let at_once = rayon::current_num_threads().clamp(1, BATCHES_AT_ONCE);
    for group in source.batches.chunks(at_once) {
        let group_metas = (group.iter())
            .map(|batch| metas.take(batch.batch_id))
            .collect::<Result<Vec<_>>>()?;
        let group_digests = (group.par_iter().zip(&group_metas))
            .map(|(batch, meta)| source_digest(batch, meta, geometry, charge_narrowed))
            .collect::<Vec<Result<Digest>>>();
        for ((batch, meta), digest) in group.iter().zip(&group_metas).zip(group_digests) {
            comparison.batch(batch, meta, digest?)?;
        }
    }
    comparison.finish();
    Ok(())
}

/// The digest of source batch `batch`, its events cut by `meta`.
fn source_digest(
    batch: &BatchInput,
    meta: &BatchMeta,
    geometry: &Geometry,
    charge_narrowed: bool,
) -> Result<Digest> {
    let mut digest = Digest::default();
    scan_batch(batch, meta, geometry, |event| {
        let h = event.header();
        digest.add(
            h.event_id,
            &EventFacts::new(h, source_print(event, charge_narrowed)),
        );
        Ok(())
    })?;
    Ok(digest)
}

/// The source's batches compared with the dataset's digests, one at a time.
struct Comparison<'a> {
    dataset: &'a Dataset,
    geometry: &'a Geometry,
    charge_narrowed: bool,
    /// The dataset's digests of the batches not compared yet.
    digests: BatchDigests,
    /// Source events compared.
    compared: u64,
    /// Batches compared event by event.
    detailed: usize,
    report: &'a mut VerifyReport,
}

impl Comparison<'_> {
    /// Compares source batch `batch` (cut by `meta`, digested as `digest`) with the
    /// dataset's events of it; event by event for the first [`DETAILED_BATCHES`] that
    /// differ.
    fn batch(&mut self, batch: &BatchInput, meta: &BatchMeta, digest: Digest) -> Result<()> {
        self.compared += digest.events;
        let stored = self.digests.0.remove(&batch.batch_id).unwrap_or_default();
        if digest == stored {
            return Ok(());
        }
        let report = &mut *self.report;
        if stored.events == 0 {
            // Listing each of its events would say nothing more (and drown the rest).
            report.problem(format!(
                "batch {} ({}): none of its {} events is in the dataset (compared with other \
                 inputs than the dataset was made from?)",
                batch.batch_id,
                batch.path.display(),
                digest.events
            ));
        } else if self.detailed < DETAILED_BATCHES {
            self.detailed += 1;
            let mut events = stored_events(self.dataset, batch.batch_id)?;
            let narrowed = self.charge_narrowed;
            compare_batch(batch, meta, self.geometry, narrowed, &mut events, report)?;
            report_extra(&events, report);
        } else {
            report.problem(format!(
                "batch {} ({}): the source has {} events, the dataset {}, and their contents \
                 differ (not listed: more than {DETAILED_BATCHES} batches differ)",
                batch.batch_id,
                batch.path.display(),
                digest.events,
                stored.events
            ));
        }
        Ok(())
    }

    /// Reports the dataset's batches the source does not have, and the events compared.
    fn finish(self) {
        let mut extra: Vec<(i64, Digest)> = self.digests.0.into_iter().collect();
        extra.sort_unstable_by_key(|(id, _)| *id);
        for (batch_id, digest) in extra {
            self.report.problem(format!(
                "{} events of batch {batch_id} are in the dataset, and the source has no such \
                 batch",
                digest.events
            ));
        }
        self.report.source_events = Some(self.compared);
    }
}

/// What the dataset holds of one event, for the event-by-event comparison.
struct StoredEvent {
    facts: EventFacts,
    seen: bool,
}

/// The dataset's events whose lineage is batch `batch_id` (one pass over the shards).
fn stored_events(dataset: &Dataset, batch_id: i64) -> Result<HashMap<i64, StoredEvent>> {
    let mut events = HashMap::new();
    for i in 0..dataset.shard_count() {
        let Ok(columns) = dataset.shard(i).and_then(|s| s.columns()) else {
            continue; // already reported by the structural checks
        };
        let view = columns.view();
        for e in 0..view.events() {
            if view.event_batch_id[e] == batch_id {
                let facts = stored_facts(&view, e, event_print(&view, e));
                events.insert(view.event_id[e], StoredEvent { facts, seen: false });
            }
        }
    }
    Ok(events)
}

/// Compares one source batch with the dataset's events of that batch, event by event.
fn compare_batch(
    batch: &BatchInput,
    meta: &BatchMeta,
    geometry: &Geometry,
    charge_narrowed: bool,
    stored: &mut HashMap<i64, StoredEvent>,
    report: &mut VerifyReport,
) -> Result<()> {
    let mut problems = Vec::new();
    scan_batch(batch, meta, geometry, |event| {
        let h = event.header();
        let facts = EventFacts::new(h, source_print(event, charge_narrowed));
        let place = format!(
            "event {} ({} row {})",
            h.event_id,
            batch.path.display(),
            h.first_row
        );
        match stored.get_mut(&h.event_id) {
            None => problems.push(format!(
                "{place} is missing from the dataset (or recorded under another batch)"
            )),
            Some(s) => {
                s.seen = true;
                if s.facts.first_row != facts.first_row {
                    problems.push(format!(
                        "{place}: lineage says batch {} row {}",
                        h.batch_id, s.facts.first_row
                    ));
                }
                if s.facts.labels != facts.labels {
                    problems.push(format!("{place}: labels differ"));
                }
                if s.facts.print != facts.print {
                    problems.push(format!(
                        "{place}: pulses differ (source {} pulses, dataset {})",
                        facts.print.count, s.facts.print.count
                    ));
                }
            }
        }
        Ok(())
    })?;
    for p in problems {
        report.problem(p);
    }
    Ok(())
}

/// Reports the dataset events of a batch that no source event matched.
fn report_extra(stored: &HashMap<i64, StoredEvent>, report: &mut VerifyReport) {
    let mut unseen: Vec<i64> = stored
        .iter()
        .filter(|(_, s)| !s.seen)
        .map(|(&id, _)| id)
        .collect();
    unseen.sort_unstable();
    for id in unseen {
        report.problem(format!(
            "event {id} is in the dataset but not in the source"
        ));
    }
}
