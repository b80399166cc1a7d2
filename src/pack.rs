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

/// Makes `v`'s capacity fit `additional` more elements: grown to exactly that, not by the
/// amortised doubling of [`Vec::reserve`], or shrunk to it where it holds more than a
/// quarter above. Buffers reused for units of varying size otherwise keep the largest
/// unit's memory (or twice it), which no memory estimate of the unit at hand accounts for:
/// gathering 1M events under a 64 MiB limit, a bucket of 108k pulses held buffers for 550k.
/// An empty vector too small is replaced rather than grown, so nothing is copied.
pub fn fit_capacity<T>(v: &mut Vec<T>, additional: usize) {
    let wanted = v.len() + additional;
    if v.capacity() < wanted {
        if v.is_empty() {
            *v = Vec::with_capacity(wanted);
        } else {
            v.reserve_exact(additional);
        }
    } else if v.capacity() > wanted + wanted / 4 {
        v.shrink_to(wanted);
    }
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
    /// Empties the columns, keeping their allocations.
    pub fn clear(&mut self) {
        self.event_dom_offsets.truncate(1);
        self.dom_sensor_id.clear();
        self.dom_pulse_offsets.truncate(1);
        self.time.clear();
        self.charge.clear();
        self.auxiliary.clear();
    }

    /// Makes room for `events`, `doms` and `pulses` more entries, and little more (see
    /// [`fit_capacity`]).
    pub fn reserve(&mut self, events: usize, doms: usize, pulses: usize) {
        fit_capacity(&mut self.event_dom_offsets, events);
        fit_capacity(&mut self.dom_sensor_id, doms);
        fit_capacity(&mut self.dom_pulse_offsets, doms);
        fit_capacity(&mut self.time, pulses);
        fit_capacity(&mut self.charge, pulses);
        fit_capacity(&mut self.auxiliary, pulses);
    }

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
    /// `sensor_id -> index in doms` for the event being packed; `u32::MAX` elsewhere.
    slot_of_sensor: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
struct DomRun {
    first_time: i64,
    sensor_id: i32,
    /// Pulses of the DOM.
    count: u32,
    /// Next output position of the DOM's pulses (linear path) or its start in `order`.
    cursor: u32,
}

/// Sensor ids up to this use the linear path's dense lookup table.
const DENSE_SENSOR_LIMIT: i32 = 1 << 22;

impl Packer {
    /// Appends `event`, DOM-packed, to `out`.
    pub fn pack(&mut self, event: RawPulses, out: &mut PackedColumns) {
        let time_sorted = event.time.windows(2).all(|w| w[0] <= w[1]);
        let dense = event
            .sensor_id
            .iter()
            .all(|&s| (0..DENSE_SENSOR_LIMIT).contains(&s));
        if time_sorted && dense {
            self.pack_time_sorted(event, out);
        } else {
            self.pack_general(event, out);
        }
        out.event_dom_offsets.push(out.dom_sensor_id.len() as i64);
    }

    /// Linear-time packing of pulses already in time order (as the Kaggle files are): DOMs
    /// in order of first appearance are in first-hit order (a stable sort then only has
    /// ties to fix), and pulses copied in source order land in time order within a DOM.
    fn pack_time_sorted(&mut self, event: RawPulses, out: &mut PackedColumns) {
        let (sensor, time) = (event.sensor_id, event.time);
        self.doms.clear();
        for (&s, &t) in sensor.iter().zip(time) {
            let s_index = s as usize;
            if s_index >= self.slot_of_sensor.len() {
                self.slot_of_sensor.resize(s_index + 1, u32::MAX);
            }
            match self.slot_of_sensor[s_index] {
                u32::MAX => {
                    self.slot_of_sensor[s_index] = self.doms.len() as u32;
                    self.doms.push(DomRun {
                        first_time: t,
                        sensor_id: s,
                        count: 1,
                        cursor: 0,
                    });
                }
                slot => self.doms[slot as usize].count += 1,
            }
        }
        // Stable and linear on sorted input: only equal first times move (by sensor id).
        self.doms.sort_by_key(|d| (d.first_time, d.sensor_id));
        let base = out.time.len();
        let mut next = base as u32;
        for (k, dom) in self.doms.iter_mut().enumerate() {
            self.slot_of_sensor[dom.sensor_id as usize] = k as u32;
            dom.cursor = next;
            next += dom.count;
            out.dom_sensor_id.push(dom.sensor_id);
            out.dom_pulse_offsets.push(next as i64);
        }
        let end = next as usize;
        out.time.resize(end, 0);
        out.charge.resize(end, 0.0);
        out.auxiliary.resize(end, 0);
        for i in 0..sensor.len() {
            let dom = &mut self.doms[self.slot_of_sensor[sensor[i] as usize] as usize];
            let at = dom.cursor as usize;
            dom.cursor += 1;
            out.time[at] = time[i];
            out.charge[at] = event.charge[i];
            out.auxiliary[at] = event.auxiliary[i];
        }
        for dom in &self.doms {
            self.slot_of_sensor[dom.sensor_id as usize] = u32::MAX;
        }
    }

    /// Packing by sorting, for pulses in any order.
    fn pack_general(&mut self, event: RawPulses, out: &mut PackedColumns) {
        let n = event.len();
        let (sensor, time) = (event.sensor_id, event.time);
        self.order.clear();
        self.order.extend(0..n as u32);
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
                count: (end - start) as u32,
                cursor: start as u32,
            });
            start = end;
        }
        self.doms
            .sort_unstable_by_key(|d| (d.first_time, d.sensor_id));
        for dom in &self.doms {
            out.dom_sensor_id.push(dom.sensor_id);
            let run = dom.cursor as usize..(dom.cursor + dom.count) as usize;
            for &i in &self.order[run] {
                let i = i as usize;
                out.time.push(event.time[i]);
                out.charge.push(event.charge[i]);
                out.auxiliary.push(event.auxiliary[i]);
            }
            out.dom_pulse_offsets.push(out.time.len() as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::RawEvent;

    #[test]
    fn fit_capacity_grows_exactly_and_gives_back_a_larger_units_memory() {
        let mut v: Vec<u64> = Vec::new();
        fit_capacity(&mut v, 1000);
        assert_eq!(v.capacity(), 1000);
        v.extend(0..10);
        // Grown by exactly what is asked, not doubled (Vec::reserve would give 2000).
        fit_capacity(&mut v, 1000);
        assert_eq!(v.capacity(), 1010);
        assert_eq!(v, (0..10).collect::<Vec<u64>>());
        v.clear();
        // Within a quarter above: kept, so similar units reuse the memory.
        fit_capacity(&mut v, 900);
        assert_eq!(v.capacity(), 1010);
        // A much smaller unit: shrunk to it.
        fit_capacity(&mut v, 100);
        assert_eq!(v.capacity(), 100);
    }

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
    fn fast_and_general_orders_agree_on_every_field() {
        let mut rng = crate::rng::Rng::new(3);
        for _ in 0..200 {
            let n = 1 + rng.below(60) as usize;
            let sensor: Vec<i32> = (0..n).map(|_| rng.below(6) as i32).collect();
            // Distinct times: no ties, so one packed order is right whatever the source order.
            let mut time: Vec<i64> = (0..n as i64).map(|i| 3 * i + rng.below(3) as i64).collect();
            time.sort();
            let sorted = event(&sensor, &time);
            let mut fast = PackedColumns::default();
            Packer::default().pack(sorted.pulses(), &mut fast);
            // The same pulses in reverse source order take the general path.
            let mut reversed = sorted.clone();
            reversed.charge.reverse();
            reversed.sensor_id.reverse();
            reversed.time.reverse();
            reversed.auxiliary.reverse();
            let mut general = PackedColumns::default();
            Packer::default().pack(reversed.pulses(), &mut general);
            assert_eq!(fast, general, "every column, charges and flags included");
            assert_eq!(fast.pulses(), n);
        }
    }

    #[test]
    fn the_general_path_keeps_ties_in_source_order() {
        // Out of time order (general path); sensor 4's two pulses at t=7 tie, and keep their
        // source order: rows 0 and 2, whose charges are 0.0 and 2.0.
        let e = event(&[4, 2, 4, 2], &[7, 9, 7, 1]);
        let mut out = PackedColumns::default();
        Packer::default().pack(e.pulses(), &mut out);
        assert_eq!(out.dom_sensor_id, vec![2, 4]);
        assert_eq!(out.time, vec![1, 9, 7, 7]);
        assert_eq!(out.charge, vec![3.0, 1.0, 0.0, 2.0]);
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
