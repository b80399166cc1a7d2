//! DOM packing: one event's pulses, grouped by DOM, as a two-level ragged layout.
//!
//! Order (the contract every shard keeps, and `shardify verify` checks):
//! - DOMs of an event by their first hit time, ties by `sensor_id`: a model that keeps the
//!   first K DOMs keeps the earliest ones;
//! - pulses of a DOM by time, ties in source order.

use crate::event::RawPulses;

/// DOM-packed columns of a run of events. Offsets start at 0 and have one more entry than
/// the level they index.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedColumns {
    /// `[events + 1]`: the DOMs of event `e` are `event_dom_offsets[e]..event_dom_offsets[e+1]`.
    pub event_dom_offsets: Vec<i64>,
    /// `[doms]`: the sensor of each DOM.
    pub dom_sensor_id: Vec<i32>,
    /// `[doms + 1]`: the pulses of DOM `d` are `dom_pulse_offsets[d]..dom_pulse_offsets[d+1]`.
    pub dom_pulse_offsets: Vec<i64>,
    /// `[pulses]`: time in ns.
    pub time: Vec<i64>,
    /// `[pulses]`: charge, the exact source value.
    pub charge: Vec<f64>,
    /// `[pulses]`: auxiliary flag, 0 or 1.
    pub auxiliary: Vec<u8>,
}

impl Default for PackedColumns {
    fn default() -> Self {
        PackedColumns {
            event_dom_offsets: vec![0],
            dom_sensor_id: Vec::new(),
            dom_pulse_offsets: vec![0],
            time: Vec::new(),
            charge: Vec::new(),
            auxiliary: Vec::new(),
        }
    }
}

impl PackedColumns {
    /// The number of events.
    pub fn events(&self) -> usize {
        self.event_dom_offsets.len() - 1
    }

    /// The number of DOMs.
    pub fn doms(&self) -> usize {
        self.dom_sensor_id.len()
    }

    /// The number of pulses.
    pub fn pulses(&self) -> usize {
        self.time.len()
    }
}

/// Packs events, reusing its scratch space between calls.
#[derive(Debug, Default)]
pub struct Packer {
    order: Vec<u32>,
    doms: Vec<DomRun>,
}

#[derive(Debug, Clone, Copy)]
struct DomRun {
    first_time: i64,
    sensor_id: i32,
    start: u32,
    end: u32,
}

impl Packer {
    /// Appends `event`, DOM-packed, to `out`.
    pub fn pack(&mut self, event: RawPulses, out: &mut PackedColumns) {
        let n = event.len();
        self.order.clear();
        self.order.extend(0..n as u32);
        let (sensor, time) = (event.sensor_id, event.time);
        // The index in the key makes the unstable sort keep source order among equal times.
        self.order
            .sort_unstable_by_key(|&i| (sensor[i as usize], time[i as usize], i));
        self.doms.clear();
        let mut start = 0usize;
        while start < n {
            let s = sensor[self.order[start] as usize];
            let mut end = start + 1;
            while end < n && sensor[self.order[end] as usize] == s {
                end += 1;
            }
            self.doms.push(DomRun {
                first_time: time[self.order[start] as usize],
                sensor_id: s,
                start: start as u32,
                end: end as u32,
            });
            start = end;
        }
        self.doms
            .sort_unstable_by_key(|d| (d.first_time, d.sensor_id));
        for dom in &self.doms {
            out.dom_sensor_id.push(dom.sensor_id);
            for &i in &self.order[dom.start as usize..dom.end as usize] {
                let i = i as usize;
                out.time.push(event.time[i]);
                out.charge.push(event.charge[i]);
                out.auxiliary.push(event.auxiliary[i]);
            }
            out.dom_pulse_offsets.push(out.time.len() as i64);
        }
        out.event_dom_offsets.push(out.dom_sensor_id.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::RawEvent;

    fn event(sensor: &[i32], time: &[i64]) -> RawEvent {
        RawEvent {
            header: None,
            sensor_id: sensor.to_vec(),
            time: time.to_vec(),
            charge: (0..sensor.len()).map(|i| i as f64).collect(),
            auxiliary: (0..sensor.len()).map(|i| (i % 2) as u8).collect(),
        }
    }

    #[test]
    fn doms_by_first_hit_pulses_by_time_ties_in_source_order() {
        // sensor 7 first hit at 10, sensor 3 at 12, sensor 5 at 10 (tie with 7: lower id first).
        let e = event(&[7, 3, 5, 7, 3, 7], &[10, 12, 10, 30, 12, 20]);
        let mut out = PackedColumns::default();
        Packer::default().pack(e.pulses(), &mut out);
        assert_eq!(out.dom_sensor_id, vec![5, 7, 3]);
        assert_eq!(out.dom_pulse_offsets, vec![0, 1, 4, 6]);
        assert_eq!(out.event_dom_offsets, vec![0, 3]);
        assert_eq!(out.time, vec![10, 10, 20, 30, 12, 12]);
        // Source indices: 2 | 0, 5, 3 | 1, 4 (the tie at t=12 keeps source order 1 then 4).
        assert_eq!(out.charge, vec![2.0, 0.0, 5.0, 3.0, 1.0, 4.0]);
        assert_eq!(out.auxiliary, vec![0, 0, 1, 1, 1, 0]);
    }

    #[test]
    fn appends_events_with_running_offsets() {
        let mut out = PackedColumns::default();
        let mut packer = Packer::default();
        packer.pack(event(&[1, 1], &[5, 6]).pulses(), &mut out);
        packer.pack(event(&[2, 3, 2], &[9, 8, 7]).pulses(), &mut out);
        assert_eq!(out.events(), 2);
        assert_eq!(out.event_dom_offsets, vec![0, 1, 3]);
        assert_eq!(out.dom_sensor_id, vec![1, 2, 3]);
        assert_eq!(out.dom_pulse_offsets, vec![0, 2, 4, 5]);
        assert_eq!(out.time, vec![5, 6, 7, 9, 8]);
    }
}
