//! Synthetic datasets in the exact Kaggle schema, of any size, for fixtures, tests and
//! benches.
//!
//! Two shapes ([`Profile`]):
//! - **real** (the default): the statistics of the real training set (DESIGN.md, section 1).
//!   Pulses per event: a log-normal body (median 60) with a 5% power-law tail (from 200,
//!   exponent 0.95) capped at 178,250, giving min 5, median ~62, mean ~160, p90 ~146,
//!   p99 ~1.1k and ~1.1% of events above 1,001 pulses. DOMs: 75% hit once, 16% two or three
//!   times, the rest a long tail (~0.39 DOMs per pulse), on strings near the event's
//!   anchor string and depth, plus noise hits anywhere. Times 5.7k-85k ns, the first pulse
//!   at median ~6,100 ns, events ~12 us long; charges float32 values of the 0.025 grid stored
//!   as float64; auxiliary half true.
//! - **simple**: the generator the fixtures were made with (median ~40 pulses per event,
//!   nearly every DOM hit once).
//!
//! Rows are sorted by event, then time; event ids increase with gaps. Geometry: IceCube's
//! layout, 78 strings on a 125 m hexagonal grid and 8 denser DeepCore strings, 60 DOMs each
//! (sensor id = string * 60 + DOM), coordinates with two decimals.

use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::format::atomic::write_bytes_atomic;
use crate::rng::Rng;
use crate::source::layout::{meta_dir, meta_file, GEOMETRY_FILE};
use spill::TableSpill;

mod publish;
mod spill;
mod table;

pub use publish::staging_dir;
use publish::{check_nothing_overwritten, SplitPaths};

pub use table::{write_parquet, write_parquet_with, writer_properties, Column, Table, Values};

/// Compression codec of generated files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Snappy, as in the Kaggle files.
    Snappy,
    /// Zstandard.
    Zstd,
    /// Gzip (`pandas.to_parquet(compression="gzip")`).
    Gzip,
    /// LZ4 with Hadoop framing (Parquet's deprecated `LZ4`).
    Lz4,
    /// Raw LZ4 blocks (Parquet's `LZ4_RAW`, what pyarrow writes for "lz4").
    Lz4Raw,
    /// Brotli.
    Brotli,
    /// None.
    Uncompressed,
}

impl Codec {
    /// Every codec, with the name `shardify-gen --codec` takes for it.
    pub const NAMED: [(&'static str, Codec); 7] = [
        ("snappy", Codec::Snappy),
        ("zstd", Codec::Zstd),
        ("gzip", Codec::Gzip),
        ("lz4", Codec::Lz4),
        ("lz4-raw", Codec::Lz4Raw),
        ("brotli", Codec::Brotli),
        ("none", Codec::Uncompressed),
    ];

    /// The codec named `name` in [`Codec::NAMED`].
    pub fn named(name: &str) -> Option<Codec> {
        Codec::NAMED
            .iter()
            .find(|(named, _)| *named == name)
            .map(|&(_, codec)| codec)
    }
}

/// The statistical shape of generated events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The real training set's statistics (see the module docs).
    Real {
        /// The most pulses one event gets (the real maximum is 178,250).
        max_event_pulses: usize,
    },
    /// The older, lighter shape the committed fixtures were generated with.
    Simple,
}

/// The largest event of the real training set, in pulses.
pub const REAL_MAX_EVENT_PULSES: usize = 178_250;

/// The fewest pulses an event of the real profile has (the real training set's smallest).
pub const REAL_MIN_EVENT_PULSES: usize = 5;

impl Default for Profile {
    fn default() -> Self {
        Profile::Real {
            max_event_pulses: REAL_MAX_EVENT_PULSES,
        }
    }
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Events in all.
    pub events: u64,
    /// Batch files to spread them over.
    pub files: u32,
    /// `train` (with labels) or `test` (without).
    pub split: String,
    /// Batch id of the first file.
    pub first_batch_id: i64,
    /// Codec.
    pub codec: Codec,
    /// Rows per row group (`None`: one row group per file, as in the Kaggle originals).
    pub row_group_rows: Option<usize>,
    /// One meta file per batch (`SPLIT_meta/batch_N.parquet`) instead of `SPLIT_meta.parquet`.
    pub meta_per_batch: bool,
    /// Seed.
    pub seed: u64,
    /// The shape of the events.
    pub profile: Profile,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            events: 1000,
            files: 2,
            split: "train".into(),
            first_batch_id: 1,
            codec: Codec::Snappy,
            row_group_rows: None,
            meta_per_batch: false,
            seed: 0,
            profile: Profile::default(),
        }
    }
}

/// Number of sensors in the generated geometry.
pub const SENSORS: usize = 5160;

/// Pulse columns of one batch file, rows sorted by event then time.
#[derive(Debug, Default, Clone)]
pub struct PulseTable {
    /// `sensor_id`.
    pub sensor_id: Vec<i16>,
    /// `time`.
    pub time: Vec<i64>,
    /// `charge`.
    pub charge: Vec<f64>,
    /// `auxiliary`.
    pub auxiliary: Vec<bool>,
    /// `event_id`.
    pub event_id: Vec<i64>,
}

/// Meta columns.
#[derive(Debug, Default, Clone)]
pub struct MetaTable {
    /// `batch_id`.
    pub batch_id: Vec<i64>,
    /// `event_id`.
    pub event_id: Vec<i64>,
    /// `first_pulse_index`.
    pub first_pulse_index: Vec<i64>,
    /// `last_pulse_index`.
    pub last_pulse_index: Vec<i64>,
    /// `azimuth` (train only).
    pub azimuth: Vec<f64>,
    /// `zenith` (train only).
    pub zenith: Vec<f64>,
    /// Whether the table has the label columns.
    pub labels: bool,
}

impl MetaTable {
    /// Appends the rows of `other`.
    pub fn extend(&mut self, other: &MetaTable) {
        self.batch_id.extend(&other.batch_id);
        self.event_id.extend(&other.event_id);
        self.first_pulse_index.extend(&other.first_pulse_index);
        self.last_pulse_index.extend(&other.last_pulse_index);
        self.azimuth.extend(&other.azimuth);
        self.zenith.extend(&other.zenith);
    }
}

fn simple_pulses_in_event(rng: &mut Rng) -> usize {
    let n = if rng.uniform() < 0.003 {
        // Power-law tail (Pareto, alpha 1.2) for the rare very bright events.
        200.0 / (1.0 - rng.uniform()).powf(1.0 / 1.2)
    } else {
        (40f64.ln() + 0.9 * rng.normal()).exp()
    };
    (n as usize).clamp(5, 20_000)
}

/// Appends one event's rows (sorted by time) to `table`, in the simple profile.
fn generate_simple_event(rng: &mut Rng, event_id: i64, table: &mut PulseTable) {
    let target = simple_pulses_in_event(rng);
    let t0 = 5000 + rng.below(7000) as i64;
    let string = rng.below(86) as i64;
    let mut rows: Vec<(i64, i16, f64, bool)> = Vec::with_capacity(target);
    while rows.len() < target {
        // DOMs cluster around one string, with stragglers anywhere in the detector.
        let sensor = if rng.uniform() < 0.7 {
            (string * 60 + rng.below(60) as i64) as i16
        } else {
            rng.below(SENSORS as u64) as i16
        };
        let hit = t0 + (-(1.0 - rng.uniform()).ln() * 3000.0) as i64;
        let mut pulses = 1;
        if rng.uniform() >= 0.78 {
            pulses += 1 + (-(1.0 - rng.uniform()).ln() * 1.5) as usize;
        }
        for k in 0..pulses.min(target - rows.len()) {
            let time = hit + (k as i64) * (5 + rng.below(200) as i64);
            let charge = (((0.6 + 0.8 * rng.normal().abs()) * 40.0).round() / 40.0) as f32 as f64;
            rows.push((time, sensor, charge, rng.uniform() < 0.6));
        }
    }
    append_rows(rows, event_id, table);
}

/// Appends `rows` (time, sensor, charge, auxiliary) sorted by time, as the Kaggle files hold
/// them.
fn append_rows(mut rows: Vec<(i64, i16, f64, bool)>, event_id: i64, table: &mut PulseTable) {
    rows.sort_by_key(|r| r.0);
    for (time, sensor, charge, aux) in rows {
        table.sensor_id.push(sensor);
        table.time.push(time);
        table.charge.push(charge);
        table.auxiliary.push(aux);
        table.event_id.push(event_id);
    }
}

/// Strings in the generated geometry, and DOMs per string.
const STRINGS: usize = 86;
const DOMS_PER_STRING: usize = 60;
/// Times of the real data, in ns.
const FIRST_TIME: i64 = 5_700;
const LAST_TIME: i64 = 85_000;

/// Pulses of one event in the real profile (see the module docs).
fn real_pulses_in_event(rng: &mut Rng, max: usize) -> usize {
    let n = if rng.uniform() < 0.05 {
        200.0 / (1.0 - rng.uniform()).powf(1.0 / 0.95)
    } else {
        (60f64.ln() + 0.55 * rng.normal()).exp()
    };
    (n as usize).clamp(REAL_MIN_EVENT_PULSES, max.max(REAL_MIN_EVENT_PULSES))
}

/// DOMs hit by an event of `pulses` pulses in the real profile: ~50 at the median event,
/// fewer per pulse in bright events (~0.39 DOMs per pulse over the whole set).
fn real_doms_in_event(pulses: usize) -> usize {
    let doms = (3.5 * (pulses as f64).powf(0.64)).round() as usize;
    doms.clamp(1, pulses.min(SENSORS))
}

/// Sensors already used by the event being generated (a DOM appears once per event).
struct UsedSensors {
    used: Vec<bool>,
    list: Vec<usize>,
}

impl UsedSensors {
    fn new() -> Self {
        UsedSensors {
            used: vec![false; SENSORS],
            list: Vec::new(),
        }
    }

    /// Takes `wanted`, or the next free sensor after it; `None` when every sensor is used.
    fn take(&mut self, wanted: usize) -> Option<usize> {
        if self.list.len() == SENSORS {
            return None;
        }
        let mut s = wanted % SENSORS;
        while self.used[s] {
            s = (s + 1) % SENSORS;
        }
        self.used[s] = true;
        self.list.push(s);
        Some(s)
    }

    fn clear(&mut self) {
        for &s in &self.list {
            self.used[s] = false;
        }
        self.list.clear();
    }
}

/// Appends one event's rows (sorted by time) to `table`, in the real profile: every hit
/// DOM gets one pulse, and the rest go mostly to a few bright DOMs (DOM `k` of `D` drawn
/// as `D * u^8`), which leaves ~75% of DOMs with a single pulse.
fn generate_real_event(
    rng: &mut Rng,
    event_id: i64,
    max_event_pulses: usize,
    used: &mut UsedSensors,
    table: &mut PulseTable,
) {
    let pulses = real_pulses_in_event(rng, max_event_pulses);
    let dom_count = real_doms_in_event(pulses);
    let t0 = FIRST_TIME + (-(1.0 - rng.uniform()).ln() * 580.0) as i64;
    let (anchor_string, anchor_dom) = (rng.below(STRINGS as u64), rng.below(60) as f64);
    used.clear();
    let mut doms: Vec<(usize, i64, usize)> = (0..dom_count)
        .map(|_| {
            // Most DOMs near the anchor (its string or a neighbour, near its depth); noise
            // hits anywhere.
            let wanted = if rng.uniform() < 0.8 {
                let string = (anchor_string + rng.below(5)) % STRINGS as u64;
                let dom = (anchor_dom + 8.0 * rng.normal()).clamp(0.0, 59.0) as u64;
                (string * DOMS_PER_STRING as u64 + dom) as usize
            } else {
                rng.below(SENSORS as u64) as usize
            };
            let sensor = used.take(wanted).expect("at most SENSORS DOMs per event");
            let hit = t0 + (-(1.0 - rng.uniform()).ln() * 2500.0) as i64;
            (sensor, hit.min(LAST_TIME), 1)
        })
        .collect();
    for _ in dom_count..pulses {
        let k = (dom_count as f64 * rng.uniform().powi(8)) as usize;
        doms[k.min(dom_count - 1)].2 += 1;
    }
    let mut rows: Vec<(i64, i16, f64, bool)> = Vec::with_capacity(pulses);
    for (sensor, first, count) in doms {
        let mut time = first;
        for _ in 0..count {
            // Charge in 0.025 steps (median ~1), float32 values stored as float64.
            let steps = (40.0 * (0.7 * rng.normal()).exp()).round().max(1.0);
            let charge = (steps * 0.025) as f32 as f64;
            rows.push((time, sensor as i16, charge, rng.uniform() < 0.5));
            time = (time + 5 + rng.below(300) as i64).min(LAST_TIME);
        }
    }
    append_rows(rows, event_id, table);
}

/// Generates one batch of `events` events of `profile` starting after `next_event_id`.
pub fn generate_batch(
    rng: &mut Rng,
    batch_id: i64,
    events: u64,
    next_event_id: &mut i64,
    labels: bool,
    profile: Profile,
) -> (PulseTable, MetaTable) {
    let mut used = UsedSensors::new();
    let mut table = PulseTable::default();
    let mut meta = MetaTable {
        labels,
        ..MetaTable::default()
    };
    for _ in 0..events {
        *next_event_id += 1 + rng.below(5) as i64;
        let first = table.time.len() as i64;
        match profile {
            Profile::Real { max_event_pulses } => {
                generate_real_event(rng, *next_event_id, max_event_pulses, &mut used, &mut table)
            }
            Profile::Simple => generate_simple_event(rng, *next_event_id, &mut table),
        }
        meta.batch_id.push(batch_id);
        meta.event_id.push(*next_event_id);
        meta.first_pulse_index.push(first);
        meta.last_pulse_index.push(table.time.len() as i64 - 1);
        if labels {
            meta.azimuth.push(rng.uniform() * std::f64::consts::TAU);
            meta.zenith.push((1.0 - 2.0 * rng.uniform()).acos());
        }
    }
    (table, meta)
}

/// The table of a pulse file's columns, in Kaggle order (`event_id` last).
pub fn pulse_columns(table: &PulseTable) -> Table {
    table.clone().into_columns()
}

impl PulseTable {
    /// The table of a pulse file's columns, in Kaggle order (`event_id` last), made of these
    /// columns without copying them.
    pub fn into_columns(self) -> Table {
        Table::new(vec![
            Column::new("sensor_id", Values::Int16(self.sensor_id)),
            Column::new("time", Values::Int64(self.time)),
            Column::new("charge", Values::Float64(self.charge)),
            Column::new("auxiliary", Values::Bool(self.auxiliary)),
            Column::new("event_id", Values::Int64(self.event_id)),
        ])
    }
}

/// The table of a meta file's columns (labels only when present).
pub fn meta_columns(meta: &MetaTable) -> Table {
    let int = |name, v: &Vec<i64>| Column::new(name, Values::Int64(v.clone()));
    let mut columns = vec![
        int("batch_id", &meta.batch_id),
        int("event_id", &meta.event_id),
        int("first_pulse_index", &meta.first_pulse_index),
        int("last_pulse_index", &meta.last_pulse_index),
    ];
    if meta.labels {
        columns.push(Column::new(
            "azimuth",
            Values::Float64(meta.azimuth.clone()),
        ));
        columns.push(Column::new("zenith", Values::Float64(meta.zenith.clone())));
    }
    Table::new(columns)
}

/// The x, y of every string: 78 on a 125 m hexagonal grid (the nearest to the centre),
/// then 8 DeepCore strings within 75 m of it.
fn string_positions() -> Vec<(f64, f64)> {
    let mut grid: Vec<(f64, f64)> = (-6i32..=6)
        .flat_map(|q| (-6i32..=6).map(move |r| (q, r)))
        .map(|(q, r)| {
            let (q, r) = (f64::from(q), f64::from(r));
            (125.0 * (q + r / 2.0), 125.0 * r * 3f64.sqrt() / 2.0)
        })
        .collect();
    grid.sort_by(|a, b| {
        let key = |p: &(f64, f64)| (p.0.hypot(p.1), p.1.atan2(p.0));
        key(a).partial_cmp(&key(b)).expect("finite")
    });
    grid.truncate(78);
    grid.extend((0..8).map(|k| {
        let angle = k as f64 * std::f64::consts::TAU / 8.0 + 0.3;
        (75.0 * angle.cos(), 75.0 * angle.sin())
    }));
    grid
}

/// Writes the synthetic geometry CSV, atomically: IceCube's layout (see the module docs).
pub fn write_geometry(path: &Path) -> Result<()> {
    write_bytes_atomic(path, geometry_csv().as_bytes())
}

/// The synthetic geometry CSV's text.
fn geometry_csv() -> String {
    let round = |v: f64| (v * 100.0).round() / 100.0;
    let mut text = String::from("sensor_id,x,y,z\n");
    for (string, (x, y)) in string_positions().into_iter().enumerate() {
        for dom in 0..DOMS_PER_STRING {
            let z = if string < 78 {
                500.0 - 17.02 * dom as f64
            } else if dom < 10 {
                // DeepCore: 10 DOMs above the dust layer, 50 densely below it.
                190.0 - 10.0 * dom as f64
            } else {
                -155.0 - 7.0 * (dom - 10) as f64
            };
            let id = string * DOMS_PER_STRING + dom;
            text.push_str(&format!("{id},{},{},{}\n", round(x), round(y), round(z)));
        }
    }
    text
}

/// What was written.
#[derive(Debug, Clone)]
pub struct SynthSummary {
    /// Batch files.
    pub batch_files: Vec<PathBuf>,
    /// Events written.
    pub events: u64,
    /// Pulses written.
    pub pulses: u64,
}

/// Writes a whole Kaggle-layout dataset under `root`: one split, and the geometry. Refuses
/// ([`Error::NotEmpty`]), before writing anything, where that would overwrite a file or
/// directory already there (another split of a generated dataset may be there).
///
/// The split is written into [`staging_dir`] and moved into place when whole, its batch
/// directory first and its meta last: a run stopped (killed, or failed) part-way leaves no
/// meta, which discovery refuses, never fewer batches that convert as a dataset. What an
/// earlier, stopped run left is removed first: its staging directory, and the batches it
/// had moved into place without their meta.
pub fn write_dataset(root: &Path, options: &SynthOptions) -> Result<SynthSummary> {
    check_options(options)?;
    let paths = SplitPaths::new(root, &options.split, options.meta_per_batch);
    let staging = &paths.staging;
    paths.take_back_unpublished()?;
    check_nothing_overwritten(root, &options.split)?;
    if staging.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(staging).at(staging)?;
    }
    let written = write_split(staging, options).and_then(|summary| {
        let geometry = root.join(GEOMETRY_FILE);
        if !geometry.exists() {
            write_geometry(&geometry)?;
        }
        paths.publish()?;
        Ok(summary)
    });
    let mut summary = match written {
        Ok(summary) => summary,
        Err(e) => {
            // Best effort: the error that stopped the run is the one to report.
            let _ = std::fs::remove_dir_all(staging);
            return Err(e);
        }
    };
    for path in &mut summary.batch_files {
        let moved = path.strip_prefix(staging).map(|name| root.join(name));
        *path = moved.expect("a batch file written under the staging directory");
    }
    Ok(summary)
}

/// Refuses options that would write what they do not say: no file, batch ids the
/// converter does not read as `batch_N.parquet` (negative, or past `i64::MAX`), row groups
/// of no rows, or events capped below the real profile's smallest.
fn check_options(options: &SynthOptions) -> Result<()> {
    if options.files == 0 {
        return Err(Error::config("files", "at least one file"));
    }
    let last_batch_id = options
        .first_batch_id
        .checked_add(i64::from(options.files) - 1);
    if options.first_batch_id < 0 || last_batch_id.is_none() {
        return Err(Error::config(
            "first_batch_id",
            format!(
                "{} with {} files: batch ids from 0 to {} (files are named batch_N.parquet)",
                options.first_batch_id,
                options.files,
                i64::MAX
            ),
        ));
    }
    if options.row_group_rows == Some(0) {
        return Err(Error::config("row_group_rows", "at least 1 row"));
    }
    if let Profile::Real { max_event_pulses } = options.profile {
        if max_event_pulses < REAL_MIN_EVENT_PULSES {
            return Err(Error::config(
                "max_event_pulses",
                format!(
                    "{max_event_pulses}: at least {REAL_MIN_EVENT_PULSES}, the real profile's \
                     fewest pulses an event"
                ),
            ));
        }
    }
    Ok(())
}

/// Writes split `options.split`'s batch files and meta under `dir`, in the Kaggle layout.
fn write_split(dir: &Path, options: &SynthOptions) -> Result<SynthSummary> {
    let labels = options.split == "train";
    let split_dir = dir.join(&options.split);
    std::fs::create_dir_all(&split_dir).at(&split_dir)?;
    // The single meta file's rows wait on disk, not in memory (48 bytes an event).
    let mut single_meta = if options.meta_per_batch {
        None
    } else {
        let schema = meta_columns(&MetaTable {
            labels,
            ..MetaTable::default()
        });
        let spill_dir = dir.join(format!("{}.spill", meta_file(&options.split)));
        Some(TableSpill::create(&spill_dir, schema, spill::CHUNK_ROWS)?)
    };
    let mut summary = SynthSummary {
        batch_files: Vec::new(),
        events: 0,
        pulses: 0,
    };
    let mut next_event_id = 0i64;
    for f in 0..options.files as u64 {
        let events = options.events / options.files as u64
            + u64::from(f < options.events % options.files as u64);
        let batch_id = options.first_batch_id + f as i64;
        let mut rng = Rng::stream(options.seed, f);
        let (table, meta) = generate_batch(
            &mut rng,
            batch_id,
            events,
            &mut next_event_id,
            labels,
            options.profile,
        );
        let pulses = table.time.len() as u64;
        let path = split_dir.join(format!("batch_{batch_id}.parquet"));
        write_parquet(
            &path,
            &table.into_columns(),
            options.codec,
            options.row_group_rows,
        )?;
        match &mut single_meta {
            Some(spill) => spill.append(&meta_columns(&meta))?,
            None => {
                let per_batch = dir.join(meta_dir(&options.split));
                std::fs::create_dir_all(&per_batch).at(&per_batch)?;
                write_parquet(
                    &per_batch.join(format!("batch_{batch_id}.parquet")),
                    &meta_columns(&meta),
                    options.codec,
                    None,
                )?;
            }
        }
        summary.events += events;
        summary.pulses += pulses;
        summary.batch_files.push(path);
    }
    if let Some(spill) = single_meta {
        let path = dir.join(meta_file(&options.split));
        spill.write_parquet(&path, options.codec, options.row_group_rows)?;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_that_would_write_what_they_do_not_say_are_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("out");
        let base = SynthOptions {
            events: 20,
            ..SynthOptions::default()
        };
        let cases = [
            (
                SynthOptions {
                    files: 0,
                    ..base.clone()
                },
                "files",
            ),
            (
                SynthOptions {
                    first_batch_id: -1,
                    ..base.clone()
                },
                "first_batch_id",
            ),
            // Before, the second file's id wrapped to i64::MIN: batch_-9223372036854775808,
            // which discovery passes over, so 5 of 10 events converted.
            (
                SynthOptions {
                    first_batch_id: i64::MAX,
                    files: 2,
                    ..base.clone()
                },
                "first_batch_id",
            ),
            (
                SynthOptions {
                    row_group_rows: Some(0),
                    ..base.clone()
                },
                "row_group_rows",
            ),
            (
                SynthOptions {
                    profile: Profile::Real {
                        max_event_pulses: REAL_MIN_EVENT_PULSES - 1,
                    },
                    ..base.clone()
                },
                "max_event_pulses",
            ),
        ];
        for (options, named) in cases {
            match write_dataset(&root, &options) {
                Err(Error::Config { field, .. }) => assert_eq!(field, named),
                other => panic!("{named}: expected a refusal, got {other:?}"),
            }
            assert!(!root.exists(), "{named}: nothing written");
        }
        // At the edges, accepted: the last batch id i64::MAX, events of the fewest pulses.
        let edges = SynthOptions {
            first_batch_id: i64::MAX,
            files: 1,
            profile: Profile::Real {
                max_event_pulses: REAL_MIN_EVENT_PULSES,
            },
            ..base
        };
        let summary = write_dataset(&root, &edges).unwrap();
        assert_eq!((summary.events, summary.pulses), (20, 20 * 5));
        let name = format!("batch_{}.parquet", i64::MAX);
        assert_eq!(summary.batch_files, [root.join("train").join(&name)]);
    }

    #[test]
    fn each_codec_has_one_name_and_is_found_by_it() {
        for (name, codec) in Codec::NAMED {
            assert_eq!(Codec::named(name), Some(codec), "{name}");
            let same: Vec<_> = Codec::NAMED.iter().filter(|(_, c)| *c == codec).collect();
            assert_eq!(same.len(), 1, "{codec:?} named more than once");
        }
        assert_eq!(Codec::named("lz4_raw"), None);
    }

    #[test]
    fn the_real_profile_has_the_real_statistics() {
        let mut next = 0;
        let (table, meta) = generate_batch(
            &mut Rng::new(5),
            1,
            20_000,
            &mut next,
            true,
            Profile::default(),
        );
        let mut pulses: Vec<usize> = (0..meta.event_id.len())
            .map(|e| (meta.last_pulse_index[e] - meta.first_pulse_index[e] + 1) as usize)
            .collect();
        pulses.sort_unstable();
        let n = pulses.len();
        let (median, p99) = (pulses[n / 2], pulses[n * 99 / 100]);
        let bright = pulses.iter().filter(|&&p| p > 1001).count() as f64 / n as f64;
        assert!(
            pulses[0] >= 5 && (55..=70).contains(&median),
            "median {median}"
        );
        assert!((800..=1500).contains(&p99), "p99 {p99}");
        assert!(
            (0.006..=0.018).contains(&bright),
            "{bright} above 1,001 pulses"
        );
        // DOMs: distinct sensors per event, and their pulse counts.
        let (mut doms, mut single) = (0usize, 0usize);
        for e in 0..n {
            let rows = meta.first_pulse_index[e] as usize..=meta.last_pulse_index[e] as usize;
            let mut count = std::collections::HashMap::new();
            for r in rows {
                *count.entry(table.sensor_id[r]).or_insert(0) += 1;
            }
            doms += count.len();
            single += count.values().filter(|&&c| c == 1).count();
        }
        let doms_per_pulse = doms as f64 / table.time.len() as f64;
        let single_fraction = single as f64 / doms as f64;
        assert!(
            (0.3..=0.55).contains(&doms_per_pulse),
            "{doms_per_pulse} DOMs per pulse"
        );
        assert!(
            (0.70..=0.82).contains(&single_fraction),
            "{single_fraction} single-pulse DOMs"
        );
        assert!(table
            .time
            .iter()
            .all(|t| (FIRST_TIME..=LAST_TIME).contains(t)));
        assert!(table.charge.iter().all(|&c| {
            let narrow = c as f32;
            f64::from(narrow) == c && (f64::from(narrow) * 40.0 - (c * 40.0).round()).abs() < 1e-3
        }));
        let aux = table.auxiliary.iter().filter(|&&a| a).count() as f64 / table.time.len() as f64;
        assert!((0.45..=0.55).contains(&aux), "{aux} auxiliary");
    }

    #[test]
    fn the_geometry_has_icecube_layout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.csv");
        write_geometry(&path).unwrap();
        let g = crate::source::Geometry::read(&path).unwrap();
        assert_eq!((g.count, g.max_sensor_id()), (SENSORS, SENSORS - 1));
        let mut strings: Vec<(i64, i64)> = (0..STRINGS)
            .map(|s| {
                let id = s * DOMS_PER_STRING;
                ((g.x[id] * 100.0) as i64, (g.y[id] * 100.0) as i64)
            })
            .collect();
        strings.sort_unstable();
        strings.dedup();
        assert_eq!(strings.len(), STRINGS, "every string at its own x, y");
        assert!(!g.fits_f32(), "decimal coordinates, as in the real file");
    }
}
