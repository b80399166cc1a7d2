//! `shardify dump`: every event as one JSON line, in stored order:
//!
//! ```json
//! {"event_id": 24, "batch_id": 1, "azimuth": 5.03, "zenith": 2.11, "doms": [{"sensor_id": 3918, "x": -3.2, "y": -66.8, "z": -477.0, "pulses": [[5928, 1.325, true]]}]}
//! ```
//! Labels are `null` without labels; pulses are `[time, charge, auxiliary]`, the charge
//! written as the exact stored value (shortest text that reads back to the same double).

use std::io::Write;

use super::Dataset;
use crate::error::{Error, Result};
use crate::format::{SensorTable, ShardView};

fn number_or_null(v: f64) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else {
        "null".into()
    }
}

/// Writes event `e` of `view` as one JSON line, with each DOM's position from `table`.
pub fn write_event(
    out: &mut impl Write,
    view: &ShardView,
    table: &SensorTable,
    e: usize,
) -> std::io::Result<()> {
    let h = view.header(e);
    write!(
        out,
        "{{\"event_id\": {}, \"batch_id\": {}, \"azimuth\": {}, \"zenith\": {}, \"doms\": [",
        h.event_id,
        h.batch_id,
        number_or_null(h.azimuth),
        number_or_null(h.zenith)
    )?;
    for (k, d) in view.dom_range(e).enumerate() {
        let sep = if k == 0 { "" } else { ", " };
        let sensor = view.dom_sensor_id.get(d);
        let [x, y, z] = table.position(sensor).unwrap_or([f64::NAN; 3]);
        write!(
            out,
            "{sep}{{\"sensor_id\": {sensor}, \"x\": {}, \"y\": {}, \"z\": {}, \"pulses\": [",
            number_or_null(x),
            number_or_null(y),
            number_or_null(z)
        )?;
        for (j, p) in view.pulse_range(d).enumerate() {
            let sep = if j == 0 { "" } else { ", " };
            write!(
                out,
                "{sep}[{}, {:?}, {}]",
                view.pulse_time.get(p),
                view.pulse_charge.get(p),
                view.pulse_auxiliary[p] != 0
            )?;
        }
        out.write_all(b"]}")?;
    }
    out.write_all(b"]}\n")
}

/// Dumps every event (or only `only_event`) of `dataset`; returns the events written.
pub fn dump(dataset: &Dataset, only_event: Option<i64>, out: &mut impl Write) -> Result<u64> {
    let mut written = 0;
    let io = |e: std::io::Error| Error::io("<output>", e);
    for i in 0..dataset.shard_count() {
        let columns = dataset.shard(i)?.columns()?;
        let view = columns.view();
        for e in 0..view.events() {
            if only_event.is_none_or(|id| id == view.event_id[e]) {
                write_event(out, &view, dataset.sensor_table(), e).map_err(io)?;
                written += 1;
            }
        }
    }
    out.flush().map_err(io)?;
    Ok(written)
}
