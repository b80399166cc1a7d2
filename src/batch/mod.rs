//! Batch layouts and the gather that fills a batch buffer from memory-mapped shards.
//!
//! A batch is one contiguous byte buffer cut into **sections** (one per tensor, each aligned
//! to [`SECTION_ALIGN`] bytes), so it moves to a GPU in a single copy and the same section
//! table describes the host and the device copy.
//!
//! **Packed** (two-level CSR, like varlen attention's `cu_seqlens`): `event_id` I64 `[B]`,
//! `event_azimuth`/`event_zenith` F64 `[B]` (NaN without labels), `event_dom_offsets` I32
//! `[B+1]`, `dom_pulse_offsets` I32 `[D+1]` (both rebased to the batch, so a packed batch
//! holds at most [`MAX_PACKED_ITEMS`] DOMs and as many pulses), `dom_sensor_id`,
//! `pulse_time`, `pulse_charge`, `pulse_auxiliary` in the dataset's stored dtypes (copied,
//! never converted), and unless left out, `dom_position` `[D,3]` in the sensor table's
//! dtype (each DOM's row of the table, looked up while gathering).
//!
//! **Padded** (DOM-flat): `event_id`, labels, `dom_features` F32 `[B, M, 4 + 3K]` and
//! `dom_mask` U8 `[B, M]`, where `M` is the largest DOM count in the batch capped at
//! `max_doms`. Per DOM: x, y, z, its pulse count, then `(time, charge, auxiliary)` of its
//! first `K` pulses (zeros past the last). When capped, an event keeps its first `max_doms`
//! DOMs in stored order, which are its earliest-hit DOMs; a DOM keeps its first `K` pulses in
//! time order.

mod from_records;
mod gather;
mod passes;
mod positions;
mod tensor_shape;
mod views;

pub use gather::Gatherer;
pub use passes::{ColumnsPasses, COLUMNS_PASSES_VAR};
pub use tensor_shape::{TensorShape, MAX_SECTION_DIMS};
pub use views::{PackedView, PaddedView};

use crate::format::pod::{try_cast_mut, Pod};
use crate::format::safetensors::Dtype;
use crate::format::StorageTypes;

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

/// Section names: the shard tensor names, plus the batch-only `dom_position`,
/// `dom_features` and `dom_mask` (one table, [`crate::format::names`]).
pub use crate::format::names as sections;

/// One tensor inside a batch buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Its name (see [`sections`]).
    pub name: &'static str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: TensorShape,
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
    fn push(&mut self, name: &'static str, dtype: Dtype, shape: impl Into<TensorShape>) {
        let shape = shape.into();
        let offset = self.total.div_ceil(SECTION_ALIGN) * SECTION_ALIGN;
        let len = shape.elements() * dtype.size();
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

/// The most DOMs, and the most pulses, one packed batch may hold: its offsets are I32, like
/// a shard's ([`crate::format::shard::MAX_SHARD_ITEMS`]).
pub const MAX_PACKED_ITEMS: usize = crate::format::shard::MAX_SHARD_ITEMS as usize;

impl BatchShape {
    /// Refuses a batch of this shape in `layout` when its offsets cannot count it: a packed
    /// batch of more than [`MAX_PACKED_ITEMS`] DOMs or pulses (its I32 offsets would wrap).
    /// Only a batch of millions of events gets there; the error names the `batching`
    /// setting. A padded batch has no offsets and always passes.
    pub fn check_fits(&self, layout: BatchLayout) -> crate::Result<()> {
        if layout != BatchLayout::Packed || self.doms.max(self.pulses) <= MAX_PACKED_ITEMS {
            return Ok(());
        }
        Err(crate::Error::config(
            "batching",
            format!(
                "a batch of {} events holds {} DOMs and {} pulses, more than the packed \
                 layout's I32 offsets count (at most {MAX_PACKED_ITEMS} of each): take \
                 fewer events a batch, or cap its pulses with a pulse budget",
                self.events, self.doms, self.pulses
            ),
        ))
    }
}

/// The section table of a batch of `shape` in `layout`; `dom_positions: false` leaves the
/// packed layout's `dom_position` out (for models that embed sensor ids, or look positions
/// up themselves in [`crate::dataset::Dataset::sensor_table`]).
pub fn plan_sections(
    layout: BatchLayout,
    shape: BatchShape,
    types: &StorageTypes,
    dom_positions: bool,
) -> Sections {
    let mut sections = Sections::default();
    plan_sections_into(&mut sections, layout, shape, types, dom_positions);
    sections
}

/// [`plan_sections`] into `sections`, replacing what it held and reusing its list's memory
/// (the loader's workers refill the table of the batch their buffer last held).
pub fn plan_sections_into(
    s: &mut Sections,
    layout: BatchLayout,
    shape: BatchShape,
    types: &StorageTypes,
    dom_positions: bool,
) {
    use sections::*;
    s.list.clear();
    s.total = 0;
    // Room for every section (grown push by push, the list cost two reallocations a
    // batch).
    s.list.reserve(10);
    let b = shape.events;
    s.push(EVENT_ID, Dtype::I64, [b]);
    s.push(EVENT_AZIMUTH, Dtype::F64, [b]);
    s.push(EVENT_ZENITH, Dtype::F64, [b]);
    match layout {
        BatchLayout::Packed => {
            s.push(EVENT_DOM_OFFSETS, Dtype::I32, [b + 1]);
            s.push(DOM_PULSE_OFFSETS, Dtype::I32, [shape.doms + 1]);
            s.push(DOM_SENSOR_ID, types.sensor_id, [shape.doms]);
            if dom_positions {
                s.push(DOM_POSITION, types.position, [shape.doms, 3]);
            }
            s.push(PULSE_TIME, types.time, [shape.pulses]);
            s.push(PULSE_CHARGE, types.charge, [shape.pulses]);
            s.push(PULSE_AUXILIARY, Dtype::BOOL, [shape.pulses]);
        }
        BatchLayout::Padded {
            max_doms,
            pulses_per_dom,
        } => {
            let m = shape.max_doms.min(max_doms);
            s.push(
                DOM_FEATURES,
                Dtype::F32,
                [b, m, features_per_dom(pulses_per_dom)],
            );
            s.push(DOM_MASK, Dtype::U8, [b, m]);
        }
    }
}

/// Features per DOM in the padded layout: x, y, z, pulse count, then 3 per kept pulse.
pub fn features_per_dom(pulses_per_dom: usize) -> usize {
    4 + 3 * pulses_per_dom
}

/// Splits `buffer` into one mutable slice per section, in order, zeroing the alignment gap
/// before each so a batch's bytes never carry data of an earlier batch. Lazily, with no
/// list allocated: take every section, or the gaps after the last one taken stay as they
/// were.
pub(crate) fn split_sections<'b, 's>(
    buffer: &'b mut [u8],
    sections: &'s Sections,
) -> impl Iterator<Item = &'b mut [u8]> + use<'b, 's> {
    let (mut rest, mut at) = (buffer, 0);
    sections.list.iter().map(move |s| {
        let (gap, tail) = std::mem::take(&mut rest).split_at_mut(s.offset - at);
        gap.fill(0);
        let (part, tail) = tail.split_at_mut(s.len);
        rest = tail;
        at = s.offset + s.len;
        part
    })
}

pub(crate) fn typed<T: Pod>(bytes: &mut [u8]) -> &mut [T] {
    try_cast_mut(bytes).expect("sections are aligned to SECTION_ALIGN and hold whole elements")
}

#[cfg(test)]
mod tests {
    use super::{BatchLayout, BatchShape, MAX_PACKED_ITEMS};
    use crate::Error;

    #[test]
    fn a_packed_batch_past_its_i32_offsets_is_refused_naming_the_batching_setting() {
        // The batch's offsets are written as i32 (gather's `rebase`).
        assert_eq!(MAX_PACKED_ITEMS, i32::MAX as usize);
        let padded = BatchLayout::Padded {
            max_doms: 128,
            pulses_per_dom: 4,
        };
        let largest = BatchShape {
            events: 13_000_000,
            doms: MAX_PACKED_ITEMS,
            pulses: MAX_PACKED_ITEMS,
            max_doms: 4000,
        };
        largest.check_fits(BatchLayout::Packed).unwrap();
        let past = [
            BatchShape {
                doms: MAX_PACKED_ITEMS + 1,
                ..largest
            },
            BatchShape {
                pulses: MAX_PACKED_ITEMS + 1,
                ..largest
            },
        ];
        for shape in past {
            match shape.check_fits(BatchLayout::Packed) {
                Err(Error::Config { field, problem }) => {
                    assert_eq!(field, "batching");
                    for count in [shape.events, shape.doms, shape.pulses] {
                        assert!(problem.contains(&count.to_string()), "{problem}");
                    }
                }
                other => panic!("{shape:?}: expected a batching error, got {other:?}"),
            }
            shape.check_fits(padded).unwrap();
        }
    }
}
