//! Synthetic datasets in the exact Kaggle schema, of any size, for fixtures, tests and
//! benches.
//!
//! Shape (chosen to resemble the real data, see DESIGN.md): pulses per event log-normal
//! (median ~40) with a rare power-law tail up to ~20,000; ~78% of DOMs hit once; rows sorted
//! by event, then time; charges of `f32` precision stored as `f64`; event ids increasing
//! with gaps. Geometry: 86 strings x 60 DOMs, coordinates with two decimals.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int16Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, IoContext, Result};
use crate::rng::Rng;

/// Compression codec of generated files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Snappy, as in the Kaggle files.
    Snappy,
    /// Zstandard.
    Zstd,
    /// None.
    Uncompressed,
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

fn pulses_in_event(rng: &mut Rng) -> usize {
    let n = if rng.uniform() < 0.003 {
        // Power-law tail (Pareto, alpha 1.2) for the rare very bright events.
        200.0 / (1.0 - rng.uniform()).powf(1.0 / 1.2)
    } else {
        (40f64.ln() + 0.9 * rng.normal()).exp()
    };
    (n as usize).clamp(5, 20_000)
}

/// Appends one event's rows (sorted by time) to `table`.
fn generate_event(rng: &mut Rng, event_id: i64, table: &mut PulseTable) {
    let target = pulses_in_event(rng);
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
    rows.sort_by_key(|r| r.0);
    for (time, sensor, charge, aux) in rows {
        table.sensor_id.push(sensor);
        table.time.push(time);
        table.charge.push(charge);
        table.auxiliary.push(aux);
        table.event_id.push(event_id);
    }
}

/// Generates one batch of `events` events starting after `next_event_id`.
pub fn generate_batch(
    rng: &mut Rng,
    batch_id: i64,
    events: u64,
    next_event_id: &mut i64,
    labels: bool,
) -> (PulseTable, MetaTable) {
    let mut table = PulseTable::default();
    let mut meta = MetaTable {
        labels,
        ..MetaTable::default()
    };
    for _ in 0..events {
        *next_event_id += 1 + rng.below(5) as i64;
        let first = table.time.len() as i64;
        generate_event(rng, *next_event_id, &mut table);
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

fn column(name: &str, data_type: DataType, array: ArrayRef) -> (Field, ArrayRef) {
    (Field::new(name, data_type, true), array)
}

/// The record batch of a pulse table, columns in Kaggle order (`event_id` last).
pub fn pulse_batch(table: &PulseTable) -> RecordBatch {
    record_batch(vec![
        column(
            "sensor_id",
            DataType::Int16,
            Arc::new(Int16Array::from(table.sensor_id.clone())),
        ),
        column(
            "time",
            DataType::Int64,
            Arc::new(Int64Array::from(table.time.clone())),
        ),
        column(
            "charge",
            DataType::Float64,
            Arc::new(Float64Array::from(table.charge.clone())),
        ),
        column(
            "auxiliary",
            DataType::Boolean,
            Arc::new(BooleanArray::from(table.auxiliary.clone())),
        ),
        column(
            "event_id",
            DataType::Int64,
            Arc::new(Int64Array::from(table.event_id.clone())),
        ),
    ])
}

/// The record batch of a meta table (labels only when present).
pub fn meta_batch(meta: &MetaTable) -> RecordBatch {
    let int =
        |name, v: &Vec<i64>| column(name, DataType::Int64, Arc::new(Int64Array::from(v.clone())));
    let mut columns = vec![
        int("batch_id", &meta.batch_id),
        int("event_id", &meta.event_id),
        int("first_pulse_index", &meta.first_pulse_index),
        int("last_pulse_index", &meta.last_pulse_index),
    ];
    if meta.labels {
        columns.push(column(
            "azimuth",
            DataType::Float64,
            Arc::new(Float64Array::from(meta.azimuth.clone())),
        ));
        columns.push(column(
            "zenith",
            DataType::Float64,
            Arc::new(Float64Array::from(meta.zenith.clone())),
        ));
    }
    record_batch(columns)
}

fn record_batch(columns: Vec<(Field, ArrayRef)>) -> RecordBatch {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("columns of equal length")
}

/// Writes `batch` as a Parquet file.
pub fn write_parquet(
    path: &Path,
    batch: &RecordBatch,
    codec: Codec,
    row_group_rows: Option<usize>,
) -> Result<()> {
    let compression = match codec {
        Codec::Snappy => Compression::SNAPPY,
        Codec::Zstd => Compression::ZSTD(ZstdLevel::default()),
        Codec::Uncompressed => Compression::UNCOMPRESSED,
    };
    let properties = WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_row_count(Some(row_group_rows.unwrap_or(usize::MAX).max(1)))
        .build();
    let file = File::create(path).at(path)?;
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties))
        .map_err(|e| Error::parquet(path, e))?;
    writer.write(batch).map_err(|e| Error::parquet(path, e))?;
    writer.close().map_err(|e| Error::parquet(path, e))?;
    Ok(())
}

/// Writes the synthetic geometry CSV.
pub fn write_geometry(path: &Path) -> Result<()> {
    let mut text = String::from("sensor_id,x,y,z\n");
    for id in 0..SENSORS {
        let (string, dom) = (id / 60, id % 60);
        let angle = string as f64 * 0.7;
        let radius = 25.0 + 60.0 * (string as f64).sqrt();
        let x = (radius * angle.cos() * 100.0).round() / 100.0;
        let y = (radius * angle.sin() * 100.0).round() / 100.0;
        let z = ((500.0 - 17.02 * dom as f64) * 100.0).round() / 100.0;
        text.push_str(&format!("{id},{x},{y},{z}\n"));
    }
    std::fs::write(path, text).at(path)
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

/// Writes a whole Kaggle-layout dataset under `root`.
pub fn write_dataset(root: &Path, options: &SynthOptions) -> Result<SynthSummary> {
    if options.files == 0 {
        return Err(Error::Config("at least one file".into()));
    }
    let labels = options.split == "train";
    let split_dir = root.join(&options.split);
    std::fs::create_dir_all(&split_dir).at(&split_dir)?;
    write_geometry(&root.join("sensor_geometry.csv"))?;
    let mut all_meta = MetaTable {
        labels,
        ..MetaTable::default()
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
        let (table, meta) = generate_batch(&mut rng, batch_id, events, &mut next_event_id, labels);
        let path = split_dir.join(format!("batch_{batch_id}.parquet"));
        write_parquet(
            &path,
            &pulse_batch(&table),
            options.codec,
            options.row_group_rows,
        )?;
        if options.meta_per_batch {
            let dir = root.join(format!("{}_meta", options.split));
            std::fs::create_dir_all(&dir).at(&dir)?;
            write_parquet(
                &dir.join(format!("batch_{batch_id}.parquet")),
                &meta_batch(&meta),
                options.codec,
                None,
            )?;
        }
        all_meta.extend(&meta);
        summary.events += events;
        summary.pulses += table.time.len() as u64;
        summary.batch_files.push(path);
    }
    if !options.meta_per_batch {
        let path = root.join(format!("{}_meta.parquet", options.split));
        write_parquet(
            &path,
            &meta_batch(&all_meta),
            options.codec,
            options.row_group_rows,
        )?;
    }
    Ok(summary)
}
