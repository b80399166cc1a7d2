//! `shardify verify`: checksums and every structural invariant of a dataset, and with a
//! source directory, that every source pulse is in the dataset exactly once, unchanged
//! (see the `source` submodule for how that comparison stays in memory proportional to the number of
//! batch files, not events).
//!
//! Problems are collected, not fatal: the report names each (up to [`MAX_LISTED`]).

mod source;

use std::path::Path;

use rayon::prelude::*;

use super::{ChecksumPolicy, Dataset};
use crate::error::Result;
use crate::format::order::{bucket_of, shuffle_key};
use crate::format::safetensors::Dtype;
use crate::format::{names, SensorTable, ShardLayout, ShardView};
use crate::source::{Geometry, InputSet};
use source::{BatchDigests, PulsePrint};

/// The most problems listed in a report (all are counted).
pub const MAX_LISTED: usize = 50;

/// Bytes of records shards checked at once (each decoded into memory while checked).
pub const DECODED_BYTES: u64 = 1 << 30;

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

    /// Counts `text` as found before the problem listed at `index`.
    fn problem_before(&mut self, index: usize, text: String) {
        self.problem_count += 1;
        if index < MAX_LISTED {
            self.problems.insert(index.min(self.problems.len()), text);
            self.problems.truncate(MAX_LISTED);
        }
    }

    /// Adds what `other` found after what this one found.
    fn absorb(&mut self, other: VerifyReport) {
        self.shards += other.shards;
        self.events += other.events;
        self.pulses += other.pulses;
        self.problem_count += other.problem_count;
        let room = MAX_LISTED.saturating_sub(self.problems.len());
        self.problems.extend(other.problems.into_iter().take(room));
    }
}

/// What the checks of one shard found.
struct ShardCheck {
    /// Its problems, and its shard, event and pulse counts.
    report: VerifyReport,
    /// Problems listed before its first event's (where one across the shard boundary goes).
    before_events: usize,
    /// The (shuffle key, event id) of its first and last events, when it has events.
    keys: Option<((u64, i64), (u64, i64))>,
    /// Its events summed per lineage batch (with a source to compare).
    digests: BatchDigests,
}

/// Checks shard `i` on its own: its tensors' types against the manifest, each event's
/// order, bucket and packing, and (with `digests`) sums its events per batch. `Err`: the
/// shard could not be read (the problem, once).
fn check_shard(
    dataset: &Dataset,
    i: usize,
    digests: bool,
) -> std::result::Result<ShardCheck, String> {
    let manifest = dataset.manifest();
    let types = manifest.schema.types;
    let table = dataset.sensor_table();
    let shard = dataset.shard(i).map_err(|e| e.to_string())?;
    let columns = shard.columns().map_err(|e| e.to_string())?;
    let view = columns.view();
    let mut report = VerifyReport {
        shards: 1,
        ..VerifyReport::default()
    };
    let mut sums = BatchDigests::default();
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
    let before_events = report.problems.len();
    let mut problem = |text: String| report.problem(format!("{file}: {text}"));
    let bucket: Option<u64> = shard
        .header()
        .metadata
        .get("shard")
        .and_then(|s| s.parse().ok());
    let seed = manifest.parameters.seed;
    let mut pulses = 0u64;
    // (shuffle key, event id) of the shard's first event and of the one before `e`.
    let mut first: Option<(u64, i64)> = None;
    let mut previous: Option<(u64, i64)> = None;
    for e in 0..view.events() {
        let id = view.event_id[e];
        let key = shuffle_key(seed, id);
        if previous.is_some_and(|p| p >= (key, id)) {
            problem(format!(
                "event {id} (index {e}) breaks the global shuffle order or repeats an event id"
            ));
        }
        first.get_or_insert((key, id));
        previous = Some((key, id));
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
        pulses += print.count;
        if digests {
            sums.add(&view, e, print);
        }
    }
    let keys = first.zip(previous);
    report.pulses = pulses;
    report.events = view.events() as u64;
    Ok(ShardCheck {
        report,
        before_events,
        keys,
        digests: sums,
    })
}

/// Verifies the dataset in `dir`, and against `source` when given.
pub fn verify(dir: &Path, source: Option<&InputSet>) -> Result<VerifyReport> {
    verify_decoding_at_most(dir, source, DECODED_BYTES)
}

/// [`verify`], with records shards checked as many at once as fit `decoded_bytes`.
fn verify_decoding_at_most(
    dir: &Path,
    source: Option<&InputSet>,
    decoded_bytes: u64,
) -> Result<VerifyReport> {
    let dataset = Dataset::open(dir, ChecksumPolicy::Lazy)?;
    let manifest = dataset.manifest();
    let mut report = VerifyReport::default();
    let geometry = source.map(|s| Geometry::read(&s.geometry)).transpose()?;
    let mut digests = BatchDigests::default();
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
    // Shards are checked in parallel, then their findings joined in shard order: the
    // global order across two shards is checked there, and the report is the one a
    // single pass would write. A records shard is checked decoded into memory, so those
    // are checked as many at once as fit `decoded_bytes`.
    let at_once = match manifest.schema.layout {
        ShardLayout::Columns => dataset.shard_count(),
        ShardLayout::Records => {
            let largest = manifest.shards.iter().map(|s| s.bytes).max().unwrap_or(1);
            usize::try_from(decoded_bytes / largest.max(1)).unwrap_or(usize::MAX)
        }
    };
    let shards: Vec<usize> = (0..dataset.shard_count()).collect();
    let mut checks: Vec<std::result::Result<ShardCheck, String>> = Vec::new();
    for group in shards.chunks(at_once.max(1)) {
        checks.par_extend(
            group
                .par_iter()
                .map(|&i| check_shard(&dataset, i, source.is_some())),
        );
    }
    let mut previous_key: Option<(u64, i64)> = None;
    for (i, check) in checks.into_iter().enumerate() {
        let mut check = match check {
            Ok(check) => check,
            Err(problem) => {
                report.problem(problem);
                continue;
            }
        };
        if let Some(((key, id), last)) = check.keys {
            if previous_key.is_some_and(|p| p >= (key, id)) {
                let file = &manifest.shards[i].file;
                check.report.problem_before(
                    check.before_events,
                    format!(
                        "{file}: event {id} (index 0) breaks the global shuffle order or \
                         repeats an event id"
                    ),
                );
            }
            previous_key = Some(last);
        }
        report.absorb(check.report);
        digests.merge(check.digests);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::small_shards_fixture;

    /// The fixture in several shards of `layout`, with its manifest edited by `edit`.
    fn edited(
        dir: &Path,
        layout: ShardLayout,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> std::path::PathBuf {
        drop(small_shards_fixture(dir));
        let mut out = dir.join("ds");
        if layout == ShardLayout::Records {
            let records = dir.join("records");
            crate::dataset::copy::copy_dataset(
                &out,
                &records,
                Some(layout),
                &crate::convert::Silent,
            )
            .unwrap();
            out = records;
        }
        let path = out.join("manifest.json");
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut manifest);
        std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
        out
    }

    #[test]
    fn an_order_broken_between_two_shards_is_named_where_it_breaks_and_nowhere_else() {
        let dir = tempfile::tempdir().unwrap();
        let out = edited(dir.path(), ShardLayout::Columns, |m| {
            let shards = m["shards"].as_array_mut().unwrap();
            assert!(shards.len() >= 4, "{} shards", shards.len());
            shards.swap(1, 2);
        });
        let dataset = Dataset::open(&out, ChecksumPolicy::Lazy).unwrap();
        let moved = dataset.shard(2).unwrap().columns().unwrap().view().event_id[0];
        let report = verify(&out, None).unwrap();
        assert_eq!(report.problem_count, 1, "{:?}", report.problems);
        assert_eq!(
            report.problems[0],
            format!(
                "{}: event {moved} (index 0) breaks the global shuffle order or repeats an \
                 event id",
                dataset.manifest().shards[2].file
            )
        );
        assert_eq!(report.shards, dataset.shard_count());
        assert_eq!(report.events, dataset.manifest().totals.events);
        assert_eq!(report.pulses, dataset.manifest().totals.pulses);
    }

    #[test]
    fn problems_of_every_shard_are_counted_and_the_first_listed_in_shard_order() {
        // Columns shards all at once; records shards (decoded to be checked) one at a time
        // and all at once.
        for (layout, decoded_bytes) in [
            (ShardLayout::Columns, DECODED_BYTES),
            (ShardLayout::Records, 1),
            (ShardLayout::Records, DECODED_BYTES),
        ] {
            problems_counted_and_listed_in_shard_order(layout, decoded_bytes);
        }
    }

    fn problems_counted_and_listed_in_shard_order(layout: ShardLayout, decoded_bytes: u64) {
        // Another seed in the manifest: most events break the order and leave their bucket,
        // in every shard (and across each boundary).
        let dir = tempfile::tempdir().unwrap();
        let out = edited(dir.path(), layout, |m| {
            let seed = m["parameters"]["seed"].as_u64().unwrap();
            m["parameters"]["seed"] = (seed + 1).into();
        });
        let dataset = Dataset::open(&out, ChecksumPolicy::Lazy).unwrap();
        let parameters = &dataset.manifest().parameters;
        // The rules counted event by event over the shards in order, independently.
        let (mut expected, mut first_problem_shard) = (0u64, Vec::new());
        let mut previous: Option<(u64, i64)> = None;
        for i in 0..dataset.shard_count() {
            let shard = dataset.shard(i).unwrap();
            let bucket: u64 = shard.header().metadata["shard"].parse().unwrap();
            let columns = shard.columns().unwrap();
            let view = columns.view();
            for &id in view.event_id.iter() {
                let key = shuffle_key(parameters.seed, id);
                let found = u64::from(previous.is_some_and(|p| p >= (key, id)))
                    + u64::from(bucket_of(key, parameters.bucket_count) != bucket);
                first_problem_shard.extend(std::iter::repeat_n(i, found as usize));
                expected += found;
                previous = Some((key, id));
            }
        }
        assert!(expected > MAX_LISTED as u64 * 2, "{expected} problems");
        let report = verify_decoding_at_most(&out, None, decoded_bytes).unwrap();
        assert_eq!(report.problem_count, expected);
        assert_eq!(report.problems.len(), MAX_LISTED);
        for (problem, &i) in report.problems.iter().zip(&first_problem_shard) {
            let file = &dataset.manifest().shards[i].file;
            assert!(
                problem.starts_with(&format!("{file}: ")),
                "{problem} (shard {i})"
            );
        }
    }
}
