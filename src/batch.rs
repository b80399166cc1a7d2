//! Batch layouts and the gather that fills a batch buffer from memory-mapped shards.
//!
//! A batch is one contiguous byte buffer cut into **sections** (one per tensor, each aligned
//! to [`SECTION_ALIGN`] bytes), so it moves to a GPU in a single copy and the same section
//! table describes the host and the device copy.
//!
//! **Packed** (two-level CSR, like varlen attention's `cu_seqlens`): `event_id` I64 `[B]`,
//! `event_azimuth`/`event_zenith` F64 `[B]` (NaN without labels), `event_dom_offsets` I32
//! `[B+1]`, `dom_pulse_offsets` I32 `[D+1]` (both rebased to the batch), `dom_sensor_id`,
//! `dom_position` `[D,3]`, `pulse_time`, `pulse_charge`, `pulse_auxiliary` in the dataset's
//! stored dtypes (copied, never converted).
//!
//! **Padded** (DOM-flat): `event_id`, labels, `dom_features` F32 `[B, M, 4 + 3K]` and
//! `dom_mask` U8 `[B, M]`, where `M` is the largest DOM count in the batch capped at
//! `max_doms`. Per DOM: x, y, z, its pulse count, then `(time, charge, auxiliary)` of its
//! first `K` pulses (zeros past the last). When capped, an event keeps its first `max_doms`
//! DOMs in stored order, which are its earliest-hit DOMs; a DOM keeps its first `K` pulses in
//! time order.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::format::pod::{try_cast_mut, Pod};
use crate::format::safetensors::Dtype;
use crate::format::{ShardView, StorageTypes};
use crate::prefetch::prefetch;
use crate::sampler::{BatchPlan, EventRef};

/// Alignment of every section, in bytes (a cache line; also what GPU copies like).
pub const SECTION_ALIGN: usize = 64;

/// How a batch is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BatchLayout {
    /// Two-level CSR in stored dtypes.
    Packed,
    /// DOM-flat padded features with a mask.
    Padded {
        /// Cap on DOMs per event (`M` is at most this).
        max_doms: usize,
        /// Pulses kept per DOM (`K`).
        pulses_per_dom: usize,
    },
}

/// Section names, in one place.
pub mod sections {
    /// `[B]` I64.
    pub const EVENT_ID: &str = "event_id";
    /// `[B]` F64.
    pub const EVENT_AZIMUTH: &str = "event_azimuth";
    /// `[B]` F64.
    pub const EVENT_ZENITH: &str = "event_zenith";
    /// `[B+1]` I32.
    pub const EVENT_DOM_OFFSETS: &str = "event_dom_offsets";
    /// `[D+1]` I32.
    pub const DOM_PULSE_OFFSETS: &str = "dom_pulse_offsets";
    /// `[D]` stored dtype.
    pub const DOM_SENSOR_ID: &str = "dom_sensor_id";
    /// `[D,3]` stored dtype.
    pub const DOM_POSITION: &str = "dom_position";
    /// `[P]` stored dtype.
    pub const PULSE_TIME: &str = "pulse_time";
    /// `[P]` stored dtype.
    pub const PULSE_CHARGE: &str = "pulse_charge";
    /// `[P]` U8.
    pub const PULSE_AUXILIARY: &str = "pulse_auxiliary";
    /// `[B, M, 4 + 3K]` F32.
    pub const DOM_FEATURES: &str = "dom_features";
    /// `[B, M]` U8.
    pub const DOM_MASK: &str = "dom_mask";
}

/// One tensor inside a batch buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Its name (see [`sections`]).
    pub name: &'static str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte offset in the buffer (a multiple of [`SECTION_ALIGN`]).
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

/// The sections of one batch, in buffer order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sections {
    /// The sections.
    pub list: Vec<Section>,
    /// Bytes the buffer must hold.
    pub total: usize,
}

impl Sections {
    fn push(&mut self, name: &'static str, dtype: Dtype, shape: Vec<usize>) {
        let offset = self.total.div_ceil(SECTION_ALIGN) * SECTION_ALIGN;
        let len = shape.iter().product::<usize>() * dtype.size();
        self.list.push(Section {
            name,
            dtype,
            shape,
            offset,
            len,
        });
        self.total = offset + len;
    }

    /// The section called `name`.
    pub fn get(&self, name: &str) -> Option<&Section> {
        self.list.iter().find(|s| s.name == name)
    }

    /// Bytes of payload (without alignment padding): what a batch delivers.
    pub fn payload_bytes(&self) -> usize {
        self.list.iter().map(|s| s.len).sum()
    }
}

/// The size of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchShape {
    /// Events.
    pub events: usize,
    /// DOMs.
    pub doms: usize,
    /// Pulses.
    pub pulses: usize,
    /// Largest DOM count of an event.
    pub max_doms: usize,
}

/// The section table of a batch of `shape` in `layout`.
pub fn plan_sections(layout: BatchLayout, shape: BatchShape, types: &StorageTypes) -> Sections {
    use sections::*;
    let mut s = Sections::default();
    let b = shape.events;
    s.push(EVENT_ID, Dtype::I64, vec![b]);
    s.push(EVENT_AZIMUTH, Dtype::F64, vec![b]);
    s.push(EVENT_ZENITH, Dtype::F64, vec![b]);
    match layout {
        BatchLayout::Packed => {
            s.push(EVENT_DOM_OFFSETS, Dtype::I32, vec![b + 1]);
            s.push(DOM_PULSE_OFFSETS, Dtype::I32, vec![shape.doms + 1]);
            s.push(DOM_SENSOR_ID, types.sensor_id, vec![shape.doms]);
            s.push(DOM_POSITION, types.position, vec![shape.doms, 3]);
            s.push(PULSE_TIME, types.time, vec![shape.pulses]);
            s.push(PULSE_CHARGE, types.charge, vec![shape.pulses]);
            s.push(PULSE_AUXILIARY, Dtype::BOOL, vec![shape.pulses]);
        }
        BatchLayout::Padded {
            max_doms,
            pulses_per_dom,
        } => {
            let m = shape.max_doms.min(max_doms);
            s.push(
                DOM_FEATURES,
                Dtype::F32,
                vec![b, m, features_per_dom(pulses_per_dom)],
            );
            s.push(DOM_MASK, Dtype::U8, vec![b, m]);
        }
    }
    s
}

/// Features per DOM in the padded layout: x, y, z, pulse count, then 3 per kept pulse.
pub fn features_per_dom(pulses_per_dom: usize) -> usize {
    4 + 3 * pulses_per_dom
}

/// Gathers batches from a dataset's shards, caching one validated view per shard.
pub struct Gatherer<'a> {
    dataset: &'a Dataset,
    views: Vec<Option<ShardView<'a>>>,
}

/// Splits `buffer` into one mutable slice per section, zeroing the alignment gaps between
/// them so a batch's bytes never carry data of an earlier batch.
fn split_sections<'b>(buffer: &'b mut [u8], sections: &Sections) -> Vec<&'b mut [u8]> {
    let mut parts = Vec::with_capacity(sections.list.len());
    let mut rest = buffer;
    let mut at = 0;
    for s in &sections.list {
        let (gap, tail) = std::mem::take(&mut rest).split_at_mut(s.offset - at);
        gap.fill(0);
        let (part, tail) = tail.split_at_mut(s.len);
        parts.push(part);
        rest = tail;
        at = s.offset + s.len;
    }
    parts
}

fn typed<T: Pod>(bytes: &mut [u8]) -> &mut [T] {
    try_cast_mut(bytes).expect("sections are aligned to SECTION_ALIGN and hold whole elements")
}

impl<'a> Gatherer<'a> {
    /// A gatherer over `dataset`.
    pub fn new(dataset: &'a Dataset) -> Gatherer<'a> {
        Gatherer {
            dataset,
            views: (0..dataset.shard_count()).map(|_| None).collect(),
        }
    }

    fn view(&mut self, shard: u32) -> Result<ShardView<'a>> {
        let slot = &mut self.views[shard as usize];
        if let Some(view) = slot {
            return Ok(*view);
        }
        let view = self.dataset.shard(shard as usize)?.view()?;
        *slot = Some(view);
        Ok(view)
    }

    /// The shape of the batch `plan` describes.
    pub fn shape(&mut self, plan: &BatchPlan) -> Result<BatchShape> {
        let mut shape = BatchShape {
            events: plan.events.len(),
            ..BatchShape::default()
        };
        for (b, &EventRef { shard, index }) in plan.events.iter().enumerate() {
            // Two steps ahead: the event's DOM offsets, then (once those are in cache) its
            // pulse offsets.
            if let Some(far) = plan.events.get(b + 2 * PREFETCH_AHEAD) {
                let v = self.view(far.shard)?;
                let i = far.index as usize;
                prefetch(&v.event_dom_offsets[i..i + 2]);
            }
            if let Some(near) = plan.events.get(b + PREFETCH_AHEAD) {
                let v = self.view(near.shard)?;
                let doms = v.dom_range(near.index as usize);
                prefetch(&v.dom_pulse_offsets[doms.start..=doms.end]);
            }
            let v = self.view(shard)?;
            let doms = v.dom_range(index as usize);
            shape.doms += doms.len();
            shape.max_doms = shape.max_doms.max(doms.len());
            shape.pulses +=
                (v.dom_pulse_offsets[doms.end] - v.dom_pulse_offsets[doms.start]) as usize;
        }
        Ok(shape)
    }

    /// Fills `buffer` (at least `sections.total` bytes, aligned to [`SECTION_ALIGN`]) with
    /// the batch `plan` in `layout`.
    pub fn gather(
        &mut self,
        plan: &BatchPlan,
        layout: BatchLayout,
        sections: &Sections,
        buffer: &mut [u8],
    ) -> Result<()> {
        if buffer.len() < sections.total || (buffer.as_ptr() as usize) % SECTION_ALIGN != 0 {
            return Err(Error::Config("batch buffer too small or misaligned".into()));
        }
        let mut parts = split_sections(&mut buffer[..sections.total], sections).into_iter();
        let mut next = || parts.next().expect("one part per section");
        let (ids, azimuth, zenith) = (
            typed::<i64>(next()),
            typed::<f64>(next()),
            typed::<f64>(next()),
        );
        for (b, &EventRef { shard, index }) in plan.events.iter().enumerate() {
            if let Some(ahead) = plan.events.get(b + PREFETCH_AHEAD) {
                let v = self.view(ahead.shard)?;
                let i = ahead.index as usize;
                prefetch(&v.event_id[i..=i]);
                for labels in [v.event_azimuth, v.event_zenith].into_iter().flatten() {
                    prefetch(&labels[i..=i]);
                }
            }
            let v = self.view(shard)?;
            let i = index as usize;
            ids[b] = v.event_id[i];
            azimuth[b] = v.event_azimuth.map_or(f64::NAN, |a| a[i]);
            zenith[b] = v.event_zenith.map_or(f64::NAN, |z| z[i]);
        }
        match layout {
            BatchLayout::Packed => {
                let rest: Vec<&mut [u8]> = std::iter::from_fn(|| Some(next())).take(7).collect();
                self.gather_packed(plan, rest)
            }
            BatchLayout::Padded { pulses_per_dom, .. } => {
                let m = sections
                    .get(sections::DOM_MASK)
                    .expect("padded layout")
                    .shape[1];
                let (features, mask) = (typed::<f32>(next()), next());
                self.gather_padded(plan, m, pulses_per_dom, features, mask)
            }
        }
    }

    /// Prefetches the column data of a run of consecutive events.
    fn prefetch_run(&mut self, run: &[EventRef]) -> Result<()> {
        let v = self.view(run[0].shard)?;
        let RunExtent { doms, pulses, .. } = RunExtent::of(&v, run);
        let (d0, d1, p0, p1) = (doms.start, doms.end, pulses.start, pulses.end);
        prefetch(element_bytes(sized(v.dom_sensor_id.raw()), d0, d1));
        prefetch(element_bytes(sized(v.dom_position.raw()), 3 * d0, 3 * d1));
        prefetch(element_bytes(sized(v.pulse_time.raw()), p0, p1));
        prefetch(element_bytes(sized(v.pulse_charge.raw()), p0, p1));
        prefetch(element_bytes((v.pulse_auxiliary, 1), p0, p1));
        Ok(())
    }

    fn gather_packed(&mut self, plan: &BatchPlan, mut parts: Vec<&mut [u8]>) -> Result<()> {
        let [event_doms, dom_pulses, sensor, position, time, charge, aux] = &mut parts[..] else {
            unreachable!("seven packed sections");
        };
        let event_doms = typed::<i32>(event_doms);
        let dom_pulses = typed::<i32>(dom_pulses);
        event_doms[0] = 0;
        dom_pulses[0] = 0;
        let (mut d_out, mut p_out, mut b) = (0usize, 0usize, 0usize);
        // Maximal runs of consecutive events of one shard are copied column by column at once.
        let runs: Vec<&[EventRef]> = plan
            .events
            .chunk_by(|x, y| x.shard == y.shard && x.index + 1 == y.index)
            .collect();
        for (r, run) in runs.iter().enumerate() {
            if let Some(ahead) = runs.get(r + PREFETCH_AHEAD) {
                self.prefetch_run(ahead)?;
            }
            let v = self.view(run[0].shard)?;
            let RunExtent {
                events: (first, last),
                doms,
                pulses: std::ops::Range { start: p0, end: p1 },
            } = RunExtent::of(&v, run);
            copy_elements(
                sized(v.dom_sensor_id.raw()),
                doms.start,
                doms.end,
                sensor,
                d_out,
            );
            copy_elements(
                sized(v.dom_position.raw()),
                3 * doms.start,
                3 * doms.end,
                position,
                3 * d_out,
            );
            copy_elements(sized(v.pulse_time.raw()), p0, p1, time, p_out);
            copy_elements(sized(v.pulse_charge.raw()), p0, p1, charge, p_out);
            copy_elements((v.pulse_auxiliary, 1), p0, p1, aux, p_out);
            let pulse_shift = p_out as i64 - p0 as i64;
            for (k, &o) in v.dom_pulse_offsets[doms.start + 1..=doms.end]
                .iter()
                .enumerate()
            {
                dom_pulses[d_out + 1 + k] = (o + pulse_shift) as i32;
            }
            let dom_shift = d_out as i64 - doms.start as i64;
            for &o in &v.event_dom_offsets[first + 1..=last + 1] {
                b += 1;
                event_doms[b] = (o + dom_shift) as i32;
            }
            d_out += doms.len();
            p_out += p1 - p0;
        }
        Ok(())
    }

    fn gather_padded(
        &mut self,
        plan: &BatchPlan,
        m: usize,
        k: usize,
        features: &mut [f32],
        mask: &mut [u8],
    ) -> Result<()> {
        let f = features_per_dom(k);
        features.fill(0.0);
        mask.fill(0);
        for (b, &EventRef { shard, index }) in plan.events.iter().enumerate() {
            let v = self.view(shard)?;
            for (slot, d) in v.dom_range(index as usize).take(m).enumerate() {
                let row = &mut features[(b * m + slot) * f..(b * m + slot + 1) * f];
                let pulses = v.pulse_range(d);
                row[0] = v.dom_position.get(3 * d) as f32;
                row[1] = v.dom_position.get(3 * d + 1) as f32;
                row[2] = v.dom_position.get(3 * d + 2) as f32;
                row[3] = pulses.len() as f32;
                for (j, p) in pulses.take(k).enumerate() {
                    row[4 + 3 * j] = v.pulse_time.get(p) as f32;
                    row[5 + 3 * j] = v.pulse_charge.get(p) as f32;
                    row[6 + 3 * j] = v.pulse_auxiliary[p] as f32;
                }
                mask[b * m + slot] = 1;
            }
        }
        Ok(())
    }
}

/// Copies elements `from..to` of a raw column of `size`-byte elements into `dst` at
/// element `at`.
/// Events (or runs) ahead of the one being copied whose memory is prefetched.
const PREFETCH_AHEAD: usize = 6;

/// Where a run of consecutive events of one shard lies in its columns.
struct RunExtent {
    /// First and last event index.
    events: (usize, usize),
    /// Its DOMs.
    doms: std::ops::Range<usize>,
    /// Its pulses.
    pulses: std::ops::Range<usize>,
}

impl RunExtent {
    fn of(v: &ShardView, run: &[EventRef]) -> RunExtent {
        let (first, last) = (run[0].index as usize, run[run.len() - 1].index as usize);
        let doms = v.event_dom_offsets[first] as usize..v.event_dom_offsets[last + 1] as usize;
        let pulses =
            v.dom_pulse_offsets[doms.start] as usize..v.dom_pulse_offsets[doms.end] as usize;
        RunExtent {
            events: (first, last),
            doms,
            pulses,
        }
    }
}

/// The bytes of elements `from..to` of a column.
fn element_bytes((src, size): (&[u8], usize), from: usize, to: usize) -> &[u8] {
    &src[from * size..to * size]
}

fn copy_elements((src, size): (&[u8], usize), from: usize, to: usize, dst: &mut [u8], at: usize) {
    dst[at * size..(at + to - from) * size].copy_from_slice(element_bytes((src, size), from, to));
}

fn sized((bytes, dtype): (&[u8], Dtype)) -> (&[u8], usize) {
    (bytes, dtype.size())
}
