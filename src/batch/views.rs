//! Typed host views of a batch buffer, one per layout: what a consumer reads.

use super::{sections, Sections};
use crate::format::pod::{try_cast, Pod};
use crate::format::safetensors::Dtype;
use crate::format::{FloatColumn, IntColumn};

/// The packed (CSR) view of a host batch.
#[derive(Debug, Clone, Copy)]
pub struct PackedView<'a> {
    /// `[B]`.
    pub event_id: &'a [i64],
    /// `[B]` (NaN without labels).
    pub event_azimuth: &'a [f64],
    /// `[B]` (NaN without labels).
    pub event_zenith: &'a [f64],
    /// `[B+1]`.
    pub event_dom_offsets: &'a [i32],
    /// `[D+1]`.
    pub dom_pulse_offsets: &'a [i32],
    /// `[D]`.
    pub dom_sensor_id: IntColumn<'a>,
    /// `[D*3]`, each DOM's row of the sensor table; `None` when the loader leaves
    /// positions out ([`crate::pipeline::LoaderConfig::dom_positions`]).
    pub dom_position: Option<FloatColumn<'a>>,
    /// `[P]`.
    pub pulse_time: IntColumn<'a>,
    /// `[P]`.
    pub pulse_charge: FloatColumn<'a>,
    /// `[P]`.
    pub pulse_auxiliary: &'a [u8],
}

/// The padded (DOM-flat) view of a host batch.
#[derive(Debug, Clone, Copy)]
pub struct PaddedView<'a> {
    /// `[B]`.
    pub event_id: &'a [i64],
    /// `[B]`.
    pub event_azimuth: &'a [f64],
    /// `[B]`.
    pub event_zenith: &'a [f64],
    /// `[B, M, F]`, row-major.
    pub dom_features: &'a [f32],
    /// `[B, M]`, 1 where a DOM is present.
    pub dom_mask: &'a [u8],
    /// `M`.
    pub max_doms: usize,
    /// `F`.
    pub features_per_dom: usize,
}

/// A batch buffer's sections by name.
struct SectionBytes<'a> {
    sections: &'a Sections,
    bytes: &'a [u8],
}

impl<'a> SectionBytes<'a> {
    fn bytes(&self, name: &str) -> Option<(&'a [u8], Dtype)> {
        let s = self.sections.get(name)?;
        Some((&self.bytes[s.offset..s.offset + s.len], s.dtype))
    }

    fn raw(&self, name: &str) -> &'a [u8] {
        self.bytes(name).expect("a section of this layout").0
    }

    fn typed<T: Pod>(&self, name: &str) -> &'a [T] {
        try_cast(self.raw(name)).expect("sections are aligned and hold whole elements")
    }

    fn ints(&self, name: &str) -> IntColumn<'a> {
        let (bytes, dtype) = self.bytes(name).expect("a section of this layout");
        IntColumn::from_raw(bytes, dtype).expect("an integer section")
    }

    fn floats(&self, name: &str) -> Option<FloatColumn<'a>> {
        let (bytes, dtype) = self.bytes(name)?;
        Some(FloatColumn::from_raw(bytes, dtype).expect("a float section"))
    }
}

impl<'a> PackedView<'a> {
    /// The packed view of a batch buffer (`bytes`, laid out by `sections`); `None` when it
    /// is not a packed batch.
    pub fn of(sections: &'a Sections, bytes: &'a [u8]) -> Option<PackedView<'a>> {
        use sections::*;
        sections.get(EVENT_DOM_OFFSETS)?;
        let b = SectionBytes { sections, bytes };
        Some(PackedView {
            event_id: b.typed(EVENT_ID),
            event_azimuth: b.typed(EVENT_AZIMUTH),
            event_zenith: b.typed(EVENT_ZENITH),
            event_dom_offsets: b.typed(EVENT_DOM_OFFSETS),
            dom_pulse_offsets: b.typed(DOM_PULSE_OFFSETS),
            dom_sensor_id: b.ints(DOM_SENSOR_ID),
            dom_position: b.floats(DOM_POSITION),
            pulse_time: b.ints(PULSE_TIME),
            pulse_charge: b.floats(PULSE_CHARGE).expect("a packed batch has charges"),
            pulse_auxiliary: b.raw(PULSE_AUXILIARY),
        })
    }
}

impl<'a> PaddedView<'a> {
    /// The padded view of a batch buffer (`bytes`, laid out by `sections`); `None` when it
    /// is not a padded batch.
    pub fn of(sections: &'a Sections, bytes: &'a [u8]) -> Option<PaddedView<'a>> {
        use sections::*;
        let shape = &sections.get(DOM_FEATURES)?.shape;
        let b = SectionBytes { sections, bytes };
        Some(PaddedView {
            event_id: b.typed(EVENT_ID),
            event_azimuth: b.typed(EVENT_AZIMUTH),
            event_zenith: b.typed(EVENT_ZENITH),
            dom_features: b.typed(DOM_FEATURES),
            dom_mask: b.raw(DOM_MASK),
            max_doms: shape[1],
            features_per_dom: shape[2],
        })
    }
}
