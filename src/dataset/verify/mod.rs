//! `shardify verify`: checksums and every structural invariant of a dataset, and with a
//! source directory, that every source pulse is in the dataset exactly once, unchanged
//! (see the `source` submodule for how that comparison stays in memory proportional to the number of
//! batch files, not events).
//!
//! Problems are collected, not fatal: the report names each (up to [`MAX_LISTED`]).

mod source;

use std::path::Path;

use super::{ChecksumPolicy, Dataset};
use crate::error::Result;
use crate::format::order::{bucket_of, shuffle_key};
use crate::format::safetensors::Dtype;
use crate::format::{names, SensorTable, ShardView};
use crate::source::{Geometry, InputSet};
use source::{BatchDigests, PulsePrint};

/// The most problems listed in a report (all are counted).
pub const MAX_LISTED: usize = 50;

/// The outcome of a verification.
#[derive(Debug, Default, Clone)]
pub struct VerifyReport {
    /// Shards checked.
    pub shards: usize,
    /// Events checked.
    pub events: u64,
    /// Pulses checked.
    pub pulses: u64,
    /// Source events compared, when a source was given.
    pub source_events: Option<u64>,
    /// The first [`MAX_LISTED`] problems.
    pub problems: Vec<String>,
    /// All problems found.
    pub problem_count: u64,
}

impl VerifyReport {
    fn problem(&mut self, text: String) {
        self.problem_count += 1;
        if self.problems.len() < MAX_LISTED {
            self.problems.push(text);
        }
    }

    /// Whether nothing is wrong.
    pub fn ok(&self) -> bool {
        self.problem_count == 0
    }
}

/// Verifies the dataset in `dir`, and against `source` when given.
pub fn verify(dir: &Path, source: Option<&InputSet>) -> Result<VerifyReport> {
    let dataset = Dataset::open(dir, ChecksumPolicy::Lazy)?;
    let manifest = dataset.manifest();
    let mut report = VerifyReport::default();
    let geometry = source.map(|s| Geometry::read(&s.geometry)).transpose()?;
    let mut digests = BatchDigests::default();
    let mut previous_key: Option<(u64, i64)> = None;
    let table = dataset.sensor_table();
    let types = manifest.schema.types;
    if table.dtype() != types.position {
        report.problem(format!(
            "{}: sensor_position is {:?}, the manifest schema says {:?}",
            manifest.sensor_table.file,
            table.dtype(),
            types.position
        ));
    }
    if let Some(g) = &geometry {
        check_sensor_table(table, g, &manifest.sensor_table.file, &mut report);
    }
    for i in 0..dataset.shard_count() {
        let shard = match dataset.shard(i) {
            Ok(shard) => shard,
            Err(e) => {
                report.problem(e.to_string());
                continue;
            }
        };
        let columns = match shard.columns() {
            Ok(columns) => columns,
            Err(e) => {
                report.problem(e.to_string());
                continue;
            }
        };
        let view = columns.view();
        report.shards += 1;
        let file = &manifest.shards[i].file;
        let mut problem = |text: String| report.problem(format!("{file}: {text}"));
        for (name, found, want) in [
            (
                names::DOM_SENSOR_ID,
                view.dom_sensor_id.raw().1,
                types.sensor_id,
            ),
            (names::PULSE_TIME, view.pulse_time.raw().1, types.time),
            (names::PULSE_CHARGE, view.pulse_charge.raw().1, types.charge),
        ] {
            if found != want {
                problem(format!(
                    "tensor {name} is {found:?}, the manifest schema says {want:?}"
                ));
            }
        }
        if view.event_azimuth.is_some() != types.labels {
            problem(format!(
                "labels present: {}, manifest says {}",
                view.event_azimuth.is_some(),
                types.labels
            ));
        }
        let mut shard_pulses = 0u64;
        let bucket: Option<u64> = shard
            .header()
            .metadata
            .get("shard")
            .and_then(|s| s.parse().ok());
        for e in 0..view.events() {
            let id = view.event_id[e];
            let key = shuffle_key(manifest.parameters.seed, id);
            if previous_key.is_some_and(|p| p >= (key, id)) {
                problem(format!(
                    "event {id} (index {e}) breaks the global shuffle order or repeats an event id"
                ));
            }
            previous_key = Some((key, id));
            if bucket != Some(bucket_of(key, manifest.parameters.bucket_count)) {
                problem(format!(
                    "event {id} does not belong to shard bucket {bucket:?}"
                ));
            }
            check_event(&view, e, &mut problem);
            let mut print = PulsePrint::default();
            for d in view.dom_range(e) {
                print.add_dom(&view, d);
                let sensor = view.dom_sensor_id.get(d);
                if table.position(sensor).is_none() {
                    problem(format!(
                        "event {id}: sensor {sensor} has no position in the sensor table"
                    ));
                }
            }
            shard_pulses += print.count;
            if source.is_some() {
                digests.add(&view, e, print);
            }
        }
        report.pulses += shard_pulses;
        report.events += view.events() as u64;
    }
    if report.events != manifest.totals.events || report.pulses != manifest.totals.pulses {
        report.problem(format!(
            "shards hold {} events and {} pulses, the manifest totals say {} and {}",
            report.events, report.pulses, manifest.totals.events, manifest.totals.pulses
        ));
    }
    if let (Some(source), Some(geometry)) = (source, &geometry) {
        source::compare(
            &dataset,
            source,
            geometry,
            types_charge_narrowed(&dataset),
            digests,
            &mut report,
        )?;
    }
    Ok(report)
}

fn types_charge_narrowed(dataset: &Dataset) -> bool {
    dataset.manifest().schema.types.charge == Dtype::F32
}

/// Checks the packing rules inside event `e`.
fn check_event(view: &ShardView, e: usize, problem: &mut impl FnMut(String)) {
    let id = view.event_id[e];
    let doms = view.dom_range(e);
    let mut sensors: Vec<i64> = doms.clone().map(|d| view.dom_sensor_id.get(d)).collect();
    let mut previous: Option<(i64, i64)> = None;
    for d in doms {
        let sensor = view.dom_sensor_id.get(d);
        let pulses = view.pulse_range(d);
        let first = (view.pulse_time.get(pulses.start), sensor);
        if previous.is_some_and(|p| p >= first) {
            problem(format!(
                "event {id}: DOM of sensor {sensor} is out of first-hit order"
            ));
        }
        previous = Some(first);
        for p in pulses.start + 1..pulses.end {
            if view.pulse_time.get(p) < view.pulse_time.get(p - 1) {
                problem(format!(
                    "event {id}: pulses of sensor {sensor} are out of time order"
                ));
            }
        }
        if let Some(p) = pulses.clone().find(|&p| view.pulse_auxiliary[p] > 1) {
            problem(format!(
                "event {id}: auxiliary value {} is not 0 or 1",
                view.pulse_auxiliary[p]
            ));
        }
    }
    sensors.sort_unstable();
    if let Some(w) = sensors.windows(2).find(|w| w[0] == w[1]) {
        problem(format!("event {id}: sensor {} appears as two DOMs", w[0]));
    }
}

/// Checks every row of the sensor table against the geometry it was made from: listed
/// ids at the stored precision, NaN rows for the others, and no row past the largest id.
fn check_sensor_table(table: &SensorTable, g: &Geometry, file: &str, report: &mut VerifyReport) {
    let rows = g.max_sensor_id() + 1;
    if table.rows() != rows {
        report.problem(format!(
            "{file}: {} rows, the geometry's largest sensor id needs {rows}",
            table.rows()
        ));
    }
    let narrow = |v: f64| match table.dtype() {
        Dtype::F32 => v as f32 as f64,
        _ => v,
    };
    for sensor in 0..table.rows().min(rows) {
        let want = g
            .contains(sensor as i64)
            .then(|| [g.x[sensor], g.y[sensor], g.z[sensor]].map(narrow));
        let found = table.position(sensor as i64);
        if want != found {
            report.problem(format!(
                "{file}: sensor {sensor} is at {found:?}, the geometry says {want:?}"
            ));
        }
    }
}
