//! What the gather reads of one event, from either layout: a records shard's events copied
//! into a packed batch, and the per-DOM reads of the padded layout over both layouts.

use super::gather::{PackedOut, Run};
use crate::format::records::EventRecord;
use crate::format::{RecordView, ShardView};
use crate::prefetch::{prefetch_into, PrefetchLevel};

/// Events ahead, inside a run, whose records are prefetched while one is copied: a run of
/// a window-1 batch is a whole block, where the hardware's own prefetch alone left the
/// loader 10% slower (2-core Zen 5, docs/results.md; 2 and 8 ahead were 4-6% slower than 4).
const RECORDS_AHEAD: usize = 4;

/// Copies a run of a records shard into a packed batch, event by event: each record's
/// pieces to their sections, its DOM ends rebased to the batch's pulses. The run's records
/// follow each other from its first DOM's and pulse's.
pub(super) fn copy_records(v: &RecordView, run: &Run, out: &mut PackedOut, level: PrefetchLevel) {
    let w = v.widths;
    let (sensor, time, charge) = (w.sensor_id.size(), w.time.size(), w.charge.size());
    let (mut d_out, mut p_out) = (run.dom_at, run.pulse_at);
    let mut at = w.start(run.index, run.doms.0, run.pulses.0);
    let events = run.index..run.index + run.len + 1;
    let doms = v.events.dom_offsets[events.clone()].windows(2);
    let pulses = v.event_pulse_offsets[events].windows(2);
    for (k, ((b, d), p)) in (run.at..).zip(doms).zip(pulses).enumerate() {
        let e = run.index + k;
        if k + RECORDS_AHEAD < run.len {
            let ahead = e + RECORDS_AHEAD..e + RECORDS_AHEAD + 1;
            prefetch_into(&v.records[v.record_bytes(ahead)], level);
        }
        let (d, p) = ((d[1] - d[0]) as usize, (p[1] - p[0]) as usize);
        let len = w.header() + d * w.per_dom() + p * w.per_pulse();
        let r = EventRecord::split(&v.records[at..at + len], w, d, p);
        at += len;
        out.headers.ids[b] = r.event_id();
        (out.headers.azimuth[b], out.headers.zenith[b]) =
            r.labels().unwrap_or((f64::NAN, f64::NAN));
        out.sensor[d_out * sensor..(d_out + d) * sensor].copy_from_slice(r.sensors);
        // Rebased as they are read (copied first, then added to, the loads waited for the
        // copy's wider stores: a third of the gather's own time at window 1).
        let (ends, shift) = (r.dom_ends.chunks_exact(4), p_out as i32);
        for (dst, end) in out.dom_pulses[d_out + 1..=d_out + d].iter_mut().zip(ends) {
            *dst = i32::from_le_bytes([end[0], end[1], end[2], end[3]]) + shift;
        }
        out.time[p_out * time..(p_out + p) * time].copy_from_slice(r.times);
        out.charge[p_out * charge..(p_out + p) * charge].copy_from_slice(r.charges);
        out.aux[p_out..p_out + p].copy_from_slice(r.auxiliary);
        d_out += d;
        p_out += p;
        out.event_doms[b + 1] = d_out as i32;
    }
}

/// One event's DOMs and pulses, as the padded layout reads them: DOM `k` of the event
/// (`0..doms()`), and pulses by the indexes [`PaddedSource::pulses`] gives.
pub(super) trait PaddedSource {
    /// The event's DOMs.
    fn doms(&self) -> usize;
    /// DOM `k`'s sensor id.
    fn sensor(&self, k: usize) -> i64;
    /// DOM `k`'s pulses.
    fn pulses(&self, k: usize) -> std::ops::Range<usize>;
    /// Pulse `j`'s time.
    fn time(&self, j: usize) -> i64;
    /// Pulse `j`'s charge.
    fn charge(&self, j: usize) -> f64;
    /// Pulse `j`'s auxiliary flag.
    fn auxiliary(&self, j: usize) -> u8;
}

/// An event of a columns shard.
pub(super) struct ColumnsEvent<'v, 'a> {
    view: &'v ShardView<'a>,
    first_dom: usize,
    doms: usize,
}

impl<'v, 'a> ColumnsEvent<'v, 'a> {
    /// Event `e` of `view`.
    pub(super) fn new(view: &'v ShardView<'a>, e: usize) -> Self {
        let doms = view.dom_range(e);
        ColumnsEvent {
            view,
            first_dom: doms.start,
            doms: doms.len(),
        }
    }
}

impl PaddedSource for ColumnsEvent<'_, '_> {
    fn doms(&self) -> usize {
        self.doms
    }

    fn sensor(&self, k: usize) -> i64 {
        self.view.dom_sensor_id.get(self.first_dom + k)
    }

    /// Pulse indexes in the shard.
    fn pulses(&self, k: usize) -> std::ops::Range<usize> {
        self.view.pulse_range(self.first_dom + k)
    }

    fn time(&self, j: usize) -> i64 {
        self.view.pulse_time.get(j)
    }

    fn charge(&self, j: usize) -> f64 {
        self.view.pulse_charge.get(j)
    }

    fn auxiliary(&self, j: usize) -> u8 {
        self.view.pulse_auxiliary[j]
    }
}

impl PaddedSource for EventRecord<'_> {
    fn doms(&self) -> usize {
        EventRecord::doms(self)
    }

    fn sensor(&self, k: usize) -> i64 {
        EventRecord::sensor(self, k)
    }

    /// Pulse indexes in the event.
    fn pulses(&self, k: usize) -> std::ops::Range<usize> {
        self.dom_pulses(k)
    }

    fn time(&self, j: usize) -> i64 {
        EventRecord::time(self, j)
    }

    fn charge(&self, j: usize) -> f64 {
        EventRecord::charge(self, j)
    }

    fn auxiliary(&self, j: usize) -> u8 {
        self.auxiliary[j]
    }
}
