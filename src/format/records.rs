//! The records layout of a shard: each event's pieces side by side, for loaders that read
//! events at random.
//!
//! A columns shard ([`super::shard`]) stores every DOM- and pulse-level column whole, which
//! any safetensors reader sees as arrays; an event drawn at random then costs a cache miss
//! per column and offsets array. A records shard keeps the event-level tensors and stores
//! what a batch copies of each event in one run of bytes, its *record*:
//!
//! | tensor | shape | dtype |
//! |---|---|---|
//! | `event_id`, `event_batch_id`, `event_first_row` | `[E]` | I64 |
//! | `event_azimuth`, `event_zenith` | `[E]` | F64 (train split only) |
//! | `event_dom_offsets` | `[E+1]` | I32, DOMs of event e: `[o[e], o[e+1])` |
//! | `event_pulse_offsets` | `[E+1]` | I32, pulses of event e: `[o[e], o[e+1])` |
//! | `event_records` | `[R]` | U8, the records one after the other |
//!
//! Event `e` with DOMs from `d` and pulses from `p` has its record at byte
//! `e * H + d * (S + 4) + p * (T + C + 1)` of `event_records`, S, T and C the widths of the
//! sensor ids, times and charges, and holds, little-endian and unaligned:
//! - H bytes: its id (I64), then its azimuth and zenith (F64) when the shard has labels;
//! - its DOMs' sensor ids (S bytes each);
//! - its DOMs' pulse ends (I32), counted from its first pulse: DOM k's pulses are
//!   `[end[k-1], end[k])` (0 for the first), the last is the event's pulse count;
//! - its pulses' times (T bytes each), charges (C bytes each), auxiliary flags (1 byte).
//!
//! The shard's `__metadata__` says `layout: records` and gives the three widths
//! (`dom_sensor_id`, `pulse_time`, `pulse_charge`: dtype names). The ids and labels are in
//! both places: the record for the gather, the columns for lookups by position.

use serde::{Deserialize, Serialize};

use super::columns::{FloatColumn, IntColumn};
use super::names;
use super::pod::LineAligned;
use super::safetensors::{Dtype, Header};
use super::shard::{
    check_offsets, EventTensors, ShardProblem, ShardView, Tensors, Validation, EVENT_TENSORS,
};
use crate::prefetch::prefetch;

/// How a dataset's shards store their DOM- and pulse-level data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardLayout {
    /// Whole columns, readable as arrays by any safetensors reader ([`ShardView`]).
    #[default]
    Columns,
    /// One record per event ([`RecordView`]): faster to gather at random.
    Records,
}

impl ShardLayout {
    /// The layout's name, as the manifest and the command line spell it.
    pub fn name(self) -> &'static str {
        match self {
            ShardLayout::Columns => "columns",
            ShardLayout::Records => "records",
        }
    }

    /// The layout called `name` ([`ShardLayout::name`]), if any.
    pub fn from_name(name: &str) -> Option<ShardLayout> {
        [ShardLayout::Columns, ShardLayout::Records]
            .into_iter()
            .find(|l| l.name() == name)
    }
}

/// `__metadata__` key naming a shard's layout (absent: columns).
pub const LAYOUT_KEY: &str = "layout";

/// The tensors a records shard may hold.
const RECORD_SHARD_TENSORS: [&[&str]; 2] = [
    &EVENT_TENSORS,
    &[names::EVENT_PULSE_OFFSETS, names::EVENT_RECORDS],
];

/// The widths of a record's pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordWidths {
    /// `dom_sensor_id`: I16 or I32.
    pub sensor_id: Dtype,
    /// `pulse_time`: I32 or I64.
    pub time: Dtype,
    /// `pulse_charge`: F32 or F64.
    pub charge: Dtype,
    /// Whether records hold labels.
    pub labels: bool,
}

impl RecordWidths {
    /// Bytes of a record's header: the id, and the labels when stored.
    pub fn header(&self) -> usize {
        if self.labels {
            24
        } else {
            8
        }
    }

    /// Bytes per DOM: its sensor id and pulse end.
    pub fn per_dom(&self) -> usize {
        self.sensor_id.size() + 4
    }

    /// Bytes per pulse: time, charge and flag.
    pub fn per_pulse(&self) -> usize {
        self.time.size() + self.charge.size() + 1
    }

    /// Where the record of the event with `events`, `doms` and `pulses` before it starts;
    /// with the totals, the length of all records.
    #[inline]
    pub fn start(&self, events: usize, doms: usize, pulses: usize) -> usize {
        events * self.header() + doms * self.per_dom() + pulses * self.per_pulse()
    }

    /// The widths a shard's `__metadata__` gives.
    fn from_metadata(header: &Header, labels: bool) -> Result<RecordWidths, ShardProblem> {
        let dtype = |key: &'static str, accepted: [Dtype; 2]| {
            let found = header.metadata.get(key).map(String::as_str);
            accepted
                .into_iter()
                .find(|d| Some(d.name()) == found)
                .ok_or_else(|| ShardProblem::RecordWidth {
                    key,
                    found: found.unwrap_or("").to_string(),
                })
        };
        Ok(RecordWidths {
            sensor_id: dtype(names::DOM_SENSOR_ID, [Dtype::I16, Dtype::I32])?,
            time: dtype(names::PULSE_TIME, [Dtype::I32, Dtype::I64])?,
            charge: dtype(names::PULSE_CHARGE, [Dtype::F32, Dtype::F64])?,
            labels,
        })
    }
}

/// Reads a little-endian integer of `size` bytes (2, 4 or 8) from the front of `bytes`.
#[inline]
fn int_at(bytes: &[u8], size: usize) -> i64 {
    match size {
        2 => i16::from_le_bytes([bytes[0], bytes[1]]).into(),
        4 => i32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")).into(),
        _ => i64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
    }
}

/// Reads a little-endian float of `size` bytes (4 or 8) from the front of `bytes`.
#[inline]
fn float_at(bytes: &[u8], size: usize) -> f64 {
    match size {
        4 => f32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")).into(),
        _ => f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
    }
}

/// Records ahead of the one being validated whose bytes are prefetched: a shard's first
/// validation reads it from memory, where it waited on every record's first line (71 ms
/// for the 545 MB of 320k real-profile events; 2 or 4 ahead: 38 ms, 8 ahead: 41).
const CHECK_AHEAD: usize = 4;

/// The index of the first of `sensors` (little-endian ids of `dtype`, I16 or I32) outside
/// `0..rows`, if any.
fn first_outside(sensors: &[u8], dtype: Dtype, rows: i64) -> Option<usize> {
    // Checked whole without stopping first (a loop the compiler vectorises, one per width:
    // with the width a variable it does not: 7-12% slower), searched only when one is
    // outside: shards are validated whole at their first read.
    fn first<const SIZE: usize>(sensors: &[u8], rows: i64) -> Option<usize> {
        let outside = |s: i64| !(0..rows).contains(&s);
        let ids = || sensors.chunks_exact(SIZE).map(|b| int_at(b, SIZE));
        let all_inside = ids().fold(true, |inside, s| inside & !outside(s));
        (!all_inside).then(|| ids().position(outside))?
    }
    match dtype {
        Dtype::I16 => first::<2>(sensors, rows),
        _ => first::<4>(sensors, rows),
    }
}

/// Whether I32 DOM pulse ends `ends` increase strictly from above 0 (each DOM holds a
/// pulse), checked whole without stopping first.
fn ends_increase(ends: &[u8]) -> bool {
    let ends = || ends.chunks_exact(4).map(|b| int_at(b, 4));
    let first_positive = ends().next().is_none_or(|first| first > 0);
    let steps_up = ends()
        .zip(ends().skip(1))
        .fold(true, |up, (end, next)| up & (next > end));
    first_positive & steps_up
}

/// One event's record, split into its pieces (raw little-endian bytes).
#[derive(Debug, Clone, Copy)]
pub struct EventRecord<'a> {
    /// The id, and the labels when stored.
    pub header: &'a [u8],
    /// The DOMs' sensor ids.
    pub sensors: &'a [u8],
    /// The DOMs' pulse ends (I32), counted from the event's first pulse.
    pub dom_ends: &'a [u8],
    /// The pulses' times.
    pub times: &'a [u8],
    /// The pulses' charges.
    pub charges: &'a [u8],
    /// The pulses' auxiliary flags.
    pub auxiliary: &'a [u8],
    widths: RecordWidths,
}

impl<'a> EventRecord<'a> {
    /// Splits `bytes`, the record of an event of `doms` DOMs and `pulses` pulses.
    #[inline]
    pub fn split(bytes: &'a [u8], widths: RecordWidths, doms: usize, pulses: usize) -> Self {
        let mut rest = bytes;
        let mut take = |len: usize| {
            let (piece, tail) = rest.split_at(len);
            rest = tail;
            piece
        };
        EventRecord {
            header: take(widths.header()),
            sensors: take(doms * widths.sensor_id.size()),
            dom_ends: take(doms * 4),
            times: take(pulses * widths.time.size()),
            charges: take(pulses * widths.charge.size()),
            auxiliary: take(pulses),
            widths,
        }
    }

    /// The number of DOMs.
    pub fn doms(&self) -> usize {
        self.dom_ends.len() / 4
    }

    /// The number of pulses.
    pub fn pulses(&self) -> usize {
        self.auxiliary.len()
    }

    /// The event id.
    pub fn event_id(&self) -> i64 {
        int_at(self.header, 8)
    }

    /// The labels (azimuth, zenith), when stored.
    pub fn labels(&self) -> Option<(f64, f64)> {
        self.widths.labels.then(|| {
            (
                float_at(&self.header[8..], 8),
                float_at(&self.header[16..], 8),
            )
        })
    }

    /// DOM `k`'s sensor id.
    pub fn sensor(&self, k: usize) -> i64 {
        let size = self.widths.sensor_id.size();
        int_at(&self.sensors[k * size..], size)
    }

    /// The end of DOM `k`'s pulses, counted from the event's first pulse.
    pub fn dom_end(&self, k: usize) -> usize {
        int_at(&self.dom_ends[4 * k..], 4) as usize
    }

    /// DOM `k`'s pulses, counted from the event's first pulse.
    pub fn dom_pulses(&self, k: usize) -> std::ops::Range<usize> {
        let start = if k == 0 { 0 } else { self.dom_end(k - 1) };
        start..self.dom_end(k)
    }

    /// Pulse `j`'s time.
    pub fn time(&self, j: usize) -> i64 {
        let size = self.widths.time.size();
        int_at(&self.times[j * size..], size)
    }

    /// Pulse `j`'s charge.
    pub fn charge(&self, j: usize) -> f64 {
        let size = self.widths.charge.size();
        float_at(&self.charges[j * size..], size)
    }
}

/// Typed, validated views of a records shard. Construction checks the tensors' shapes (the
/// records' length among them) and, with [`Validation::Full`], the offsets and every
/// record, so that every event's record is inside `event_records` and reads as stored.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    /// The ids, lineage, labels and DOM offsets.
    pub events: EventTensors<'a>,
    /// `[E+1]`.
    pub event_pulse_offsets: &'a [i32],
    /// `[R]`: every event's record.
    pub records: &'a [u8],
    /// The widths of the records' pieces.
    pub widths: RecordWidths,
}

impl<'a> RecordView<'a> {
    /// Validates `bytes` (a whole records shard, whose header is `header`) and returns
    /// views into it; `sensor_rows` is the number of rows of the dataset's sensor table.
    pub fn parse(
        bytes: &'a [u8],
        header: &'a Header,
        sensor_rows: usize,
        validation: Validation,
    ) -> Result<RecordView<'a>, ShardProblem> {
        if header.metadata.get(LAYOUT_KEY).map(String::as_str) != Some("records") {
            return Err(ShardProblem::Layout {
                expected: ShardLayout::Records,
            });
        }
        let t = Tensors::new(bytes, header, &RECORD_SHARD_TENSORS)?;
        let events = EventTensors::parse(&t, header)?;
        let e = events.id.len();
        let widths = RecordWidths::from_metadata(header, events.azimuth.is_some())?;
        let event_pulse_offsets = t.exact::<i32>(names::EVENT_PULSE_OFFSETS, e + 1)?;
        let total = |tensor: &'static str, offsets: &[i32]| {
            let last = *offsets.last().expect("E + 1 >= 1 offsets");
            if validation == Validation::Full {
                check_offsets(tensor, offsets, last.max(0) as usize)?;
            }
            usize::try_from(last).map_err(|_| ShardProblem::OffsetsEnd {
                tensor,
                found: last.into(),
                expected: 0,
            })
        };
        let d = total(names::EVENT_DOM_OFFSETS, events.dom_offsets)?;
        let p = total(names::EVENT_PULSE_OFFSETS, event_pulse_offsets)?;
        let view = RecordView {
            events,
            event_pulse_offsets,
            records: t.exact(names::EVENT_RECORDS, widths.start(e, d, p))?,
            widths,
        };
        if validation == Validation::Full {
            view.check_records(sensor_rows)?;
        }
        Ok(view)
    }

    /// Checks every record against the event columns and the sensor table: its id and
    /// labels, increasing DOM ends that end at its pulse count, and sensor ids that are
    /// rows of a `rows`-row table.
    fn check_records(&self, rows: usize) -> Result<(), ShardProblem> {
        let (w, mut first_dom) = (self.widths, 0);
        for e in 0..self.events() {
            if e + CHECK_AHEAD < self.events() {
                let ahead = e + CHECK_AHEAD..e + CHECK_AHEAD + 1;
                prefetch(&self.records[self.record_bytes(ahead)]);
            }
            let r = self.record(e);
            let bad = |problem: &'static str| ShardProblem::Record { event: e, problem };
            if r.event_id() != self.events.id[e] {
                return Err(bad("its id differs from event_id"));
            }
            let labels = self.events.azimuth.zip(self.events.zenith);
            if let (Some((a, z)), Some((azimuth, zenith))) = (r.labels(), labels) {
                if a.to_bits() != azimuth[e].to_bits() || z.to_bits() != zenith[e].to_bits() {
                    return Err(bad("its labels differ from event_azimuth/event_zenith"));
                }
            }
            if !ends_increase(r.dom_ends) {
                return Err(bad("its DOM pulse ends do not increase"));
            }
            let last = r.doms().checked_sub(1).map_or(0, |k| r.dom_end(k));
            if last != r.pulses() {
                return Err(bad("its last DOM pulse end is not its pulse count"));
            }
            if let Some(k) = first_outside(r.sensors, w.sensor_id, rows as i64) {
                return Err(ShardProblem::SensorOutsideTable {
                    dom: first_dom + k,
                    sensor: r.sensor(k),
                    rows,
                });
            }
            first_dom += r.doms();
        }
        Ok(())
    }

    /// The number of events.
    pub fn events(&self) -> usize {
        self.events.id.len()
    }

    /// The number of DOMs.
    pub fn doms(&self) -> usize {
        *self.events.dom_offsets.last().expect("E + 1 offsets") as usize
    }

    /// The number of pulses.
    pub fn pulses(&self) -> usize {
        *self.event_pulse_offsets.last().expect("E + 1 offsets") as usize
    }

    /// The DOM index range of event `e`.
    pub fn dom_range(&self, e: usize) -> std::ops::Range<usize> {
        self.events.dom_offsets[e] as usize..self.events.dom_offsets[e + 1] as usize
    }

    /// The pulse index range of event `e`.
    pub fn pulse_range(&self, e: usize) -> std::ops::Range<usize> {
        self.event_pulse_offsets[e] as usize..self.event_pulse_offsets[e + 1] as usize
    }

    /// The byte range of events `events`' records in [`RecordView::records`].
    #[inline]
    pub fn record_bytes(&self, events: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let start = |e: usize| {
            let (d, p) = (self.events.dom_offsets[e], self.event_pulse_offsets[e]);
            self.widths.start(e, d as usize, p as usize)
        };
        start(events.start)..start(events.end)
    }

    /// Event `e`'s record.
    pub fn record(&self, e: usize) -> EventRecord<'a> {
        let bytes = &self.records[self.record_bytes(e..e + 1)];
        let (doms, pulses) = (self.dom_range(e).len(), self.pulse_range(e).len());
        EventRecord::split(bytes, self.widths, doms, pulses)
    }

    /// The shard's DOM- and pulse-level columns, decoded from the records into memory.
    pub fn decode(&self) -> DecodedColumns<'a> {
        let w = self.widths;
        let (d, p) = (self.doms(), self.pulses());
        let mut decoded = DecodedColumns {
            records: *self,
            dom_sensor_id: LineAligned::zeroed(d * w.sensor_id.size()),
            dom_pulse_offsets: Vec::with_capacity(d + 1),
            pulse_time: LineAligned::zeroed(p * w.time.size()),
            pulse_charge: LineAligned::zeroed(p * w.charge.size()),
            pulse_auxiliary: Vec::with_capacity(p),
        };
        decoded.dom_pulse_offsets.push(0);
        // Records come in event order, so each column's pieces follow each other: byte
        // cursors into the sensor, time and charge columns.
        let mut at = [0usize; 3];
        for e in 0..self.events() {
            let r = self.record(e);
            let columns = [
                (&mut decoded.dom_sensor_id, r.sensors),
                (&mut decoded.pulse_time, r.times),
                (&mut decoded.pulse_charge, r.charges),
            ];
            for ((out, piece), at) in columns.into_iter().zip(&mut at) {
                out.bytes_mut()[*at..*at + piece.len()].copy_from_slice(piece);
                *at += piece.len();
            }
            decoded.pulse_auxiliary.extend_from_slice(r.auxiliary);
            let first = self.event_pulse_offsets[e];
            decoded
                .dom_pulse_offsets
                .extend((0..r.doms()).map(|k| first + r.dom_end(k) as i32));
        }
        decoded
    }
}

/// A records shard's columns decoded into memory ([`RecordView::decode`]): what a columns
/// shard stores, for the readers that want whole columns (verify, dump, a resident loader).
#[derive(Debug, Clone)]
pub struct DecodedColumns<'a> {
    records: RecordView<'a>,
    dom_sensor_id: LineAligned,
    dom_pulse_offsets: Vec<i32>,
    pulse_time: LineAligned,
    pulse_charge: LineAligned,
    pulse_auxiliary: Vec<u8>,
}

impl DecodedColumns<'_> {
    /// The columns as a columns shard's view.
    pub fn view(&self) -> ShardView<'_> {
        let w = self.records.widths;
        let aligned = "decoded columns are line-aligned and whole";
        let events = self.records.events;
        ShardView {
            event_id: events.id,
            event_batch_id: events.batch_id,
            event_first_row: events.first_row,
            event_azimuth: events.azimuth,
            event_zenith: events.zenith,
            event_dom_offsets: events.dom_offsets,
            dom_sensor_id: IntColumn::from_raw(self.dom_sensor_id.bytes(), w.sensor_id)
                .expect(aligned),
            dom_pulse_offsets: &self.dom_pulse_offsets,
            pulse_time: IntColumn::from_raw(self.pulse_time.bytes(), w.time).expect(aligned),
            pulse_charge: FloatColumn::from_raw(self.pulse_charge.bytes(), w.charge)
                .expect(aligned),
            pulse_auxiliary: &self.pulse_auxiliary,
        }
    }
}

/// A shard's validated view, in the shard's layout.
#[derive(Debug, Clone, Copy)]
pub enum StoredView<'a> {
    /// A columns shard.
    Columns(ShardView<'a>),
    /// A records shard.
    Records(RecordView<'a>),
}

impl<'a> StoredView<'a> {
    /// The number of events.
    pub fn events(&self) -> usize {
        match self {
            StoredView::Columns(v) => v.events(),
            StoredView::Records(v) => v.events(),
        }
    }

    /// The number of DOMs.
    pub fn doms(&self) -> usize {
        match self {
            StoredView::Columns(v) => v.doms(),
            StoredView::Records(v) => v.doms(),
        }
    }

    /// The number of pulses.
    pub fn pulses(&self) -> usize {
        match self {
            StoredView::Columns(v) => v.pulses(),
            StoredView::Records(v) => v.pulses(),
        }
    }

    /// The event-level tensors, the same in both layouts.
    #[inline]
    pub fn event_tensors(&self) -> EventTensors<'a> {
        match self {
            StoredView::Columns(v) => v.event_tensors(),
            StoredView::Records(v) => v.events,
        }
    }

    /// The pulse index range of events `events` (all their DOMs' pulses).
    pub fn pulse_range(&self, events: std::ops::Range<usize>) -> std::ops::Range<usize> {
        match self {
            StoredView::Columns(v) => {
                let doms = v.event_dom_offsets[events.start] as usize
                    ..v.event_dom_offsets[events.end] as usize;
                v.dom_pulse_offsets[doms.start] as usize..v.dom_pulse_offsets[doms.end] as usize
            }
            StoredView::Records(v) => {
                v.event_pulse_offsets[events.start] as usize
                    ..v.event_pulse_offsets[events.end] as usize
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::convert::relayout::write_view;
    use crate::format::safetensors::{self, Raw, TensorOut};
    use crate::format::shard::tests::valid_shard;

    const SENSOR_ROWS: usize = 10;

    /// `bytes` parsed as a shard of `layout` and written again in `to`; the new file's bytes.
    fn rewritten(bytes: &[u8], to: ShardLayout) -> Vec<u8> {
        let header = safetensors::parse(bytes).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.safetensors");
        let columns = match header.metadata.get(LAYOUT_KEY).map(String::as_str) {
            Some("records") => {
                let records = RecordView::parse(bytes, &header, SENSOR_ROWS, Validation::Full);
                let decoded = records.unwrap().decode();
                write_view(&path, &decoded.view(), &header.metadata, to).unwrap()
            }
            _ => {
                let view = ShardView::parse(bytes, &header, SENSOR_ROWS, Validation::Full);
                write_view(&path, &view.unwrap(), &header.metadata, to).unwrap()
            }
        };
        let written = std::fs::read(&path).unwrap();
        assert_eq!(columns.bytes, written.len() as u64);
        written
    }

    fn parse_records(bytes: &[u8]) -> Result<usize, ShardProblem> {
        let header = safetensors::parse(bytes)?;
        RecordView::parse(bytes, &header, SENSOR_ROWS, Validation::Full).map(|v| v.events())
    }

    /// `bytes` (a records shard) with its metadata and tensors changed by `change`.
    fn altered(
        bytes: &[u8],
        change: impl FnOnce(&mut BTreeMap<String, String>, &mut BTreeMap<String, Vec<u8>>),
    ) -> Vec<u8> {
        let header = safetensors::parse(bytes).unwrap();
        let mut metadata = header.metadata.clone();
        let mut data: BTreeMap<String, Vec<u8>> = header
            .tensors
            .iter()
            .map(|(name, t)| (name.clone(), bytes[t.range.clone()].to_vec()))
            .collect();
        change(&mut metadata, &mut data);
        let raws: Vec<(String, Dtype, Raw)> = data
            .iter()
            .map(|(name, bytes)| (name.clone(), header.tensors[name].dtype, Raw(bytes)))
            .collect();
        let tensors: Vec<TensorOut> = raws
            .iter()
            .map(|(name, dtype, raw)| TensorOut {
                name: name.clone(),
                dtype: *dtype,
                shape: vec![raw.0.len() / dtype.size()],
                data: raw,
            })
            .collect();
        let mut out = Vec::new();
        safetensors::write(&mut out, &metadata, &tensors).unwrap();
        out
    }

    #[test]
    fn records_hold_every_field_and_give_back_the_same_columns_file() {
        let columns = valid_shard();
        let records = rewritten(&columns, ShardLayout::Records);
        let header = safetensors::parse(&records).unwrap();
        assert_eq!(header.metadata[LAYOUT_KEY], "records");
        assert!(!header.tensors.contains_key(names::PULSE_TIME));
        let v = RecordView::parse(&records, &header, SENSOR_ROWS, Validation::Full).unwrap();
        assert_eq!(v.event_pulse_offsets, &[0, 3, 4, 8]);
        assert_eq!(v.events.dom_offsets, &[0, 2, 3, 5]);
        // The first event: DOMs of sensors 3 (pulses at 10 and 15) and 1 (12).
        let r = v.record(0);
        assert_eq!((r.event_id(), r.labels()), (100, Some((0.5, 1.5))));
        assert_eq!((r.doms(), r.pulses()), (2, 3));
        assert_eq!((r.sensor(0), r.sensor(1)), (3, 1));
        assert_eq!((r.dom_pulses(0), r.dom_pulses(1)), (0..2, 2..3));
        assert_eq!([r.time(0), r.time(1), r.time(2)], [10, 15, 12]);
        assert_eq!(r.charge(1), 15.0 / 4.0);
        assert_eq!(r.auxiliary, &[0, 1, 0]);

        // Decoded, every column equals the columns shard's.
        let original_header = safetensors::parse(&columns).unwrap();
        let original = ShardView::parse(&columns, &original_header, SENSOR_ROWS, Validation::Full);
        let (original, decoded) = (original.unwrap(), v.decode());
        let d = decoded.view();
        assert_eq!(format!("{original:?}"), format!("{d:?}"));
        // And written as columns again, the very bytes of the columns shard.
        assert!(rewritten(&records, ShardLayout::Columns) == columns);
    }

    #[test]
    fn each_layout_refuses_the_other_and_damaged_records_are_named() {
        let columns = valid_shard();
        let records = rewritten(&columns, ShardLayout::Records);
        let header = safetensors::parse(&records).unwrap();
        assert_eq!(
            ShardView::parse(&records, &header, SENSOR_ROWS, Validation::Full).err(),
            Some(ShardProblem::Layout {
                expected: ShardLayout::Columns
            })
        );
        let header = safetensors::parse(&columns).unwrap();
        assert_eq!(
            RecordView::parse(&columns, &header, SENSOR_ROWS, Validation::Full).err(),
            Some(ShardProblem::Layout {
                expected: ShardLayout::Records
            })
        );
        assert_eq!(parse_records(&records), Ok(3));

        // Event 1's record starts after event 0's (24 + 2 * 6 + 3 * 9 bytes): its id,
        // labels, one sensor id, one DOM end, then its pulse.
        let event_1 = 24 + 2 * 6 + 3 * 9;
        let with_record = |edit: &dyn Fn(&mut Vec<u8>)| {
            altered(&records, |_, data| {
                edit(data.get_mut(names::EVENT_RECORDS).unwrap())
            })
        };
        let id = with_record(&|r| r[event_1] ^= 1);
        assert_eq!(
            parse_records(&id),
            Err(ShardProblem::Record {
                event: 1,
                problem: "its id differs from event_id"
            })
        );
        let sensor =
            with_record(&|r| r[event_1 + 24..event_1 + 26].copy_from_slice(&77i16.to_le_bytes()));
        assert_eq!(
            parse_records(&sensor),
            Err(ShardProblem::SensorOutsideTable {
                dom: 2,
                sensor: 77,
                rows: SENSOR_ROWS
            })
        );
        let end =
            with_record(&|r| r[event_1 + 26..event_1 + 30].copy_from_slice(&2i32.to_le_bytes()));
        assert_eq!(
            parse_records(&end),
            Err(ShardProblem::Record {
                event: 1,
                problem: "its last DOM pulse end is not its pulse count"
            })
        );
        // Event 0's DOM ends (after its header and two sensor ids): equal, or a first DOM
        // without pulses, checked whole as the ends that climb are.
        for ends in [[3i32, 3], [0, 3]] {
            let flat: Vec<u8> = ends.iter().flat_map(|e| e.to_le_bytes()).collect();
            let steps = with_record(&|r| r[28..36].copy_from_slice(&flat));
            assert_eq!(
                parse_records(&steps),
                Err(ShardProblem::Record {
                    event: 0,
                    problem: "its DOM pulse ends do not increase"
                }),
                "DOM ends {ends:?}"
            );
        }
        let short = with_record(&|r| {
            r.pop();
        });
        assert!(matches!(
            parse_records(&short),
            Err(ShardProblem::Shape { tensor, .. }) if tensor == names::EVENT_RECORDS
        ));
        let no_width = altered(&records, |metadata, _| {
            metadata.remove(names::PULSE_TIME);
        });
        assert_eq!(
            parse_records(&no_width),
            Err(ShardProblem::RecordWidth {
                key: names::PULSE_TIME,
                found: String::new()
            })
        );
        let offsets = altered(&records, |_, data| {
            let o = data.get_mut(names::EVENT_PULSE_OFFSETS).unwrap();
            o[4..8].copy_from_slice(&0i32.to_le_bytes());
        });
        assert_eq!(
            parse_records(&offsets),
            Err(ShardProblem::OffsetsNotIncreasing {
                tensor: names::EVENT_PULSE_OFFSETS,
                index: 0
            })
        );
    }
}
