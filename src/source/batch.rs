//! Streaming one `batch_N.parquet` file as validated events, in bounded memory.

use std::path::Path;

use super::columns::{ColumnSpec, Kind, ParquetSource, EVENT_ID};
use super::geometry::Geometry;
use super::layout::BatchInput;
use super::meta::BatchMeta;
use crate::error::{Error, Result};
use crate::event::{EventHeader, RawEvent};

const SENSOR_ID: ColumnSpec = ColumnSpec {
    name: "sensor_id",
    kind: Kind::Int,
};
const TIME: ColumnSpec = ColumnSpec {
    name: "time",
    kind: Kind::Int,
};
const CHARGE: ColumnSpec = ColumnSpec {
    name: "charge",
    kind: Kind::Float,
};
const AUXILIARY: ColumnSpec = ColumnSpec {
    name: "auxiliary",
    kind: Kind::Bool,
};

/// The pulse columns, in the order [`scan_batch`] reads them.
pub const PULSE_COLUMNS: [ColumnSpec; 5] = [SENSOR_ID, TIME, CHARGE, AUXILIARY, EVENT_ID];

/// Rows decoded at a time: large enough for fast decode, small enough to bound memory.
pub const DECODE_BATCH_ROWS: usize = 64 * 1024;

/// Checks that `meta` tiles the file's `rows` rows exactly: every row in one event.
fn check_coverage(input: &BatchInput, meta: &BatchMeta, rows: u64) -> Result<()> {
    let err = |problem: String| Error::Meta {
        meta: meta.source.clone(),
        batch_file: input.path.clone(),
        batch_id: input.batch_id,
        problem,
    };
    let mut expected: i64 = 0;
    let mut previous: Option<i64> = None;
    for row in &meta.rows {
        if row.first_row > expected {
            return Err(err(format!(
                "rows {}..={} are not covered by any event in the meta",
                expected,
                row.first_row - 1
            )));
        }
        if row.first_row < expected {
            return Err(err(format!(
                "event {} (rows {}..={}) overlaps event {} which ends at row {}",
                row.event_id,
                row.first_row,
                row.last_row,
                previous.unwrap_or_default(),
                expected - 1
            )));
        }
        if row.last_row as u64 >= rows {
            return Err(err(format!(
                "event {} has rows {}..={} but the file has {} rows",
                row.event_id, row.first_row, row.last_row, rows
            )));
        }
        expected = row.last_row + 1;
        previous = Some(row.event_id);
    }
    if (expected as u64) < rows {
        return Err(err(format!(
            "rows {}..={} are not covered by any event in the meta",
            expected,
            rows - 1
        )));
    }
    Ok(())
}

/// Reads `input` and calls `on_event` for each event, in file order, after checking every
/// row against the meta (`event_id`), the geometry (`sensor_id`) and for finite charge.
pub fn scan_batch(
    input: &BatchInput,
    meta: &BatchMeta,
    geometry: &Geometry,
    mut on_event: impl FnMut(&RawEvent) -> Result<()>,
) -> Result<()> {
    let source = ParquetSource::open(&input.path)?;
    check_coverage(input, meta, source.num_rows())?;
    let path: &Path = &input.path;
    let mut event = RawEvent::default();
    let mut next_meta = meta.rows.iter();
    let mut current = next_meta.next();
    for columns in source.read(&PULSE_COLUMNS, None, DECODE_BATCH_ROWS)? {
        let columns = columns?;
        let (sensor, time, charge, aux, event_ids) = (
            columns.int(0),
            columns.int(1),
            columns.float(2),
            columns.bool(3),
            columns.int(4),
        );
        let mut i = 0;
        while i < columns.len {
            let m = current.expect("coverage check guarantees a meta row for every row");
            let end = ((m.last_row as u64 + 1 - columns.first_row) as usize).min(columns.len);
            let row_of = |j: usize| columns.first_row + j as u64;
            if let Some(j) = (i..end).find(|&j| event_ids[j] != m.event_id) {
                return Err(Error::Meta {
                    meta: meta.source.clone(),
                    batch_file: input.path.clone(),
                    batch_id: input.batch_id,
                    problem: format!(
                        "the meta puts event {} at rows {}..={}, but row {} holds event {}",
                        m.event_id,
                        m.first_row,
                        m.last_row,
                        row_of(j),
                        event_ids[j]
                    ),
                });
            }
            if let Some(j) = (i..end).find(|&j| !geometry.contains(sensor[j])) {
                return Err(Error::BadValue {
                    path: path.to_path_buf(),
                    row: row_of(j),
                    column: SENSOR_ID.name,
                    problem: format!(
                        "sensor_id {} of event {} is not in {}",
                        sensor[j],
                        m.event_id,
                        geometry.path.display()
                    ),
                });
            }
            if let Some(j) = (i..end).find(|&j| !charge[j].is_finite()) {
                return Err(Error::BadValue {
                    path: path.to_path_buf(),
                    row: row_of(j),
                    column: CHARGE.name,
                    problem: format!("charge {} of event {} is not finite", charge[j], m.event_id),
                });
            }
            if event.header.is_none() {
                event.header = Some(EventHeader {
                    event_id: m.event_id,
                    batch_id: input.batch_id,
                    first_row: m.first_row as u64,
                    azimuth: m.azimuth,
                    zenith: m.zenith,
                });
            }
            event
                .sensor_id
                .extend(sensor[i..end].iter().map(|&s| s as i32));
            event.time.extend_from_slice(&time[i..end]);
            event.charge.extend_from_slice(&charge[i..end]);
            event
                .auxiliary
                .extend(aux[i..end].iter().map(|&a| u8::from(a)));
            if row_of(end) == m.last_row as u64 + 1 {
                on_event(&event)?;
                event.clear();
                current = next_meta.next();
            }
            i = end;
        }
    }
    Ok(())
}
