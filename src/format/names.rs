//! Tensor names, in one place: the shard tensors, the sensor table's, and the batch
//! sections (a batch section named like a shard tensor holds that tensor's values for the
//! batch's events, DOMs or pulses).

/// `[E]` I64 event ids.
pub const EVENT_ID: &str = "event_id";
/// `[E]` I64 lineage: the source batch of each event.
pub const EVENT_BATCH_ID: &str = "event_batch_id";
/// `[E]` I64 lineage: each event's first row in its source batch file.
pub const EVENT_FIRST_ROW: &str = "event_first_row";
/// `[E]` F64 azimuth labels (radians; train split only).
pub const EVENT_AZIMUTH: &str = "event_azimuth";
/// `[E]` F64 zenith labels (radians; train split only).
pub const EVENT_ZENITH: &str = "event_zenith";
/// `[E+1]` I32: the DOMs of event `e` are `[o[e], o[e+1])`.
pub const EVENT_DOM_OFFSETS: &str = "event_dom_offsets";
/// `[E+1]` I32 in a records shard: the pulses of event `e` are `[o[e], o[e+1])`.
pub const EVENT_PULSE_OFFSETS: &str = "event_pulse_offsets";
/// `[R]` U8 in a records shard: every event's record ([`super::records`]).
pub const EVENT_RECORDS: &str = "event_records";
/// `[D]` I16 or I32: each DOM's sensor id, a row of the sensor table.
pub const DOM_SENSOR_ID: &str = "dom_sensor_id";
/// `[D+1]` I32: the pulses of DOM `d` are `[o[d], o[d+1])`.
pub const DOM_PULSE_OFFSETS: &str = "dom_pulse_offsets";
/// `[P]` I32 or I64 pulse times (ns).
pub const PULSE_TIME: &str = "pulse_time";
/// `[P]` F32 or F64 pulse charges.
pub const PULSE_CHARGE: &str = "pulse_charge";
/// `[P]` BOOL auxiliary flags.
pub const PULSE_AUXILIARY: &str = "pulse_auxiliary";

/// The level of the layout a shard tensor has one entry (or, for offsets, one more) per.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `event_*` tensors.
    Event,
    /// `dom_*` tensors.
    Dom,
    /// `pulse_*` tensors.
    Pulse,
}

/// The level of shard tensor `name`, from its prefix.
pub fn level(name: &str) -> Level {
    if name.starts_with("event_") {
        Level::Event
    } else if name.starts_with("dom_") {
        Level::Dom
    } else {
        Level::Pulse
    }
}

/// `[S, 3]` F64 or F32 in the sensor table (`geometry.safetensors`): x, y, z in metres of
/// sensor id `s` in row `s` (NaN for ids the geometry does not list). In a packed batch,
/// `dom_position` `[D, 3]` holds the rows of the batch's DOMs.
pub const SENSOR_POSITION: &str = "sensor_position";
/// `[D, 3]` batch section: each DOM's row of [`SENSOR_POSITION`], looked up while gathering.
pub const DOM_POSITION: &str = "dom_position";
/// `[B, M, 4 + 3K]` F32 padded-layout batch section.
pub const DOM_FEATURES: &str = "dom_features";
/// `[B, M]` U8 padded-layout batch section, 1 where a DOM is present.
pub const DOM_MASK: &str = "dom_mask";
