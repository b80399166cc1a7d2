//! One event's pulses as read from the source, before DOM packing.

/// What is known of an event besides its pulses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EventHeader {
    /// The event id (unique across the dataset).
    pub event_id: i64,
    /// Source batch id (lineage).
    pub batch_id: i64,
    /// Row of the event's first pulse in its source batch file (lineage).
    pub first_row: u64,
    /// Azimuth label in radians; `NaN` when the split has no labels.
    pub azimuth: f64,
    /// Zenith label in radians; `NaN` when the split has no labels.
    pub zenith: f64,
}

/// An event's pulses in source order, as parallel columns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawEvent {
    /// Header fields.
    pub header: Option<EventHeader>,
    /// DOM of each pulse.
    pub sensor_id: Vec<i32>,
    /// Pulse time in ns.
    pub time: Vec<i64>,
    /// Pulse charge, the exact source value.
    pub charge: Vec<f64>,
    /// Auxiliary flag, 0 or 1.
    pub auxiliary: Vec<u8>,
}

impl RawEvent {
    /// The number of pulses.
    pub fn len(&self) -> usize {
        self.time.len()
    }

    /// Whether there are no pulses.
    pub fn is_empty(&self) -> bool {
        self.time.is_empty()
    }

    /// Empties the event, keeping its allocations.
    pub fn clear(&mut self) {
        self.header = None;
        self.sensor_id.clear();
        self.time.clear();
        self.charge.clear();
        self.auxiliary.clear();
    }

    /// The header; every event handed out by a reader has one.
    pub fn header(&self) -> &EventHeader {
        self.header.as_ref().expect("event header set before use")
    }
}

/// A borrowed run of pulses (one event's), as parallel columns.
#[derive(Debug, Clone, Copy)]
pub struct RawPulses<'a> {
    /// DOM of each pulse.
    pub sensor_id: &'a [i32],
    /// Time in ns.
    pub time: &'a [i64],
    /// Charge.
    pub charge: &'a [f64],
    /// Auxiliary flag, 0 or 1.
    pub auxiliary: &'a [u8],
}

impl RawPulses<'_> {
    /// The number of pulses.
    pub fn len(&self) -> usize {
        self.time.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.time.is_empty()
    }
}

impl RawEvent {
    /// All pulses.
    pub fn pulses(&self) -> RawPulses<'_> {
        self.slice(0..self.len())
    }

    /// The pulses in `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> RawPulses<'_> {
        RawPulses {
            sensor_id: &self.sensor_id[range.clone()],
            time: &self.time[range.clone()],
            charge: &self.charge[range.clone()],
            auxiliary: &self.auxiliary[range],
        }
    }
}

/// What decides whether a column can be stored narrower without loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ValueRange {
    /// Smallest pulse time seen (ns); `i64::MAX` when none.
    pub time_min: i64,
    /// Largest pulse time seen (ns); `i64::MIN` when none.
    pub time_max: i64,
    /// Whether every charge seen survives a round trip through `f32`.
    pub charge_fits_f32: bool,
}

impl Default for ValueRange {
    fn default() -> Self {
        ValueRange {
            time_min: i64::MAX,
            time_max: i64::MIN,
            charge_fits_f32: true,
        }
    }
}

impl ValueRange {
    /// Widens the range to cover `event`.
    pub fn observe(&mut self, event: &RawEvent) {
        for &t in &event.time {
            self.time_min = self.time_min.min(t);
            self.time_max = self.time_max.max(t);
        }
        self.charge_fits_f32 &= event.charge.iter().all(|&c| (c as f32) as f64 == c);
    }

    /// The range covering both.
    pub fn merge(self, other: ValueRange) -> ValueRange {
        ValueRange {
            time_min: self.time_min.min(other.time_min),
            time_max: self.time_max.max(other.time_max),
            charge_fits_f32: self.charge_fits_f32 && other.charge_fits_f32,
        }
    }

    /// Whether every time fits `i32`.
    pub fn time_fits_i32(&self) -> bool {
        self.time_min > self.time_max
            || (self.time_min >= i32::MIN as i64 && self.time_max <= i32::MAX as i64)
    }
}
