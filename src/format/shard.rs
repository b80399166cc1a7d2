//! One shard: a safetensors file of whole DOM-packed columns for a run of events.
//!
//! | tensor | shape | dtype |
//! |---|---|---|
//! | `event_id` | `[E]` | I64 |
//! | `event_batch_id` | `[E]` | I64 (lineage: source batch) |
//! | `event_first_row` | `[E]` | I64 (lineage: first row in the source batch file) |
//! | `event_azimuth`, `event_zenith` | `[E]` | F64 (train split only) |
//! | `event_dom_offsets` | `[E+1]` | I64, DOMs of event e: `[o[e], o[e+1])` |
//! | `dom_sensor_id` | `[D]` | I16 (I32 when the geometry has larger ids) |
//! | `dom_position` | `[D, 3]` | F64 x,y,z in metres (F32 when exact, or with `--lossy`) |
//! | `dom_pulse_offsets` | `[D+1]` | I64, pulses of DOM d: `[o[d], o[d+1])` |
//! | `pulse_time` | `[P]` | I64 ns (I32 when every value fits) |
//! | `pulse_charge` | `[P]` | F64 (F32 when exact, or with `--lossy`) |
//! | `pulse_auxiliary` | `[P]` | BOOL |
//!
//! Offsets are local to the shard and start at 0.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use super::atomic::Durability;
use super::pod::{as_bytes, try_cast, Pod};
use super::safetensors::{self, Dtype, Header, TensorBytes, TensorOut};
use crate::error::{Error, Result};
use crate::event::EventHeader;
use crate::pack::PackedColumns;
use crate::source::Geometry;

/// Tensor names, in one place.
pub mod names {
    /// `[E]` event ids.
    pub const EVENT_ID: &str = "event_id";
    /// `[E]` source batch ids.
    pub const EVENT_BATCH_ID: &str = "event_batch_id";
    /// `[E]` first source rows.
    pub const EVENT_FIRST_ROW: &str = "event_first_row";
    /// `[E]` azimuth labels.
    pub const EVENT_AZIMUTH: &str = "event_azimuth";
    /// `[E]` zenith labels.
    pub const EVENT_ZENITH: &str = "event_zenith";
    /// `[E+1]` DOM offsets.
    pub const EVENT_DOM_OFFSETS: &str = "event_dom_offsets";
    /// `[D]` sensor ids.
    pub const DOM_SENSOR_ID: &str = "dom_sensor_id";
    /// `[D,3]` positions.
    pub const DOM_POSITION: &str = "dom_position";
    /// `[D+1]` pulse offsets.
    pub const DOM_PULSE_OFFSETS: &str = "dom_pulse_offsets";
    /// `[P]` times.
    pub const PULSE_TIME: &str = "pulse_time";
    /// `[P]` charges.
    pub const PULSE_CHARGE: &str = "pulse_charge";
    /// `[P]` auxiliary flags.
    pub const PULSE_AUXILIARY: &str = "pulse_auxiliary";
}

/// The storage type of each column whose width is decided per dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StorageTypes {
    /// `dom_sensor_id`: I16 or I32.
    pub sensor_id: Dtype,
    /// `dom_position`: F32 or F64.
    pub position: Dtype,
    /// `pulse_time`: I32 or I64.
    pub time: Dtype,
    /// `pulse_charge`: F32 or F64.
    pub charge: Dtype,
    /// Whether the labels are stored.
    pub labels: bool,
}

/// What the manifest records of a written shard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardEntry {
    /// File name inside the dataset directory.
    pub file: String,
    /// Events in the shard.
    pub events: u64,
    /// DOMs in the shard.
    pub doms: u64,
    /// Pulses in the shard.
    pub pulses: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// XXH3-64 of the whole file, hex.
    pub xxh3: String,
}

/// Everything a shard holds, before writing. The packed columns may come in several
/// parts (packed in parallel); the shard holds their concatenation.
pub struct ShardContents<'a> {
    /// Event headers in stored order (all parts).
    pub headers: &'a [EventHeader],
    /// Packed columns, part after part.
    pub parts: &'a [PackedColumns],
    /// Geometry to join per DOM.
    pub geometry: &'a Geometry,
    /// Column widths.
    pub types: StorageTypes,
    /// Shard-level `__metadata__`.
    pub metadata: BTreeMap<String, String>,
}

/// Where a run of a tensor's elements comes from; converted to the tensor's dtype while
/// writing.
enum Elements<'a> {
    Bytes(&'a [u8]),
    Ints(&'a [i64]),
    Sensors(&'a [i32]),
    Floats(&'a [f64]),
    Positions(&'a [i32], &'a Geometry),
    Offsets { values: &'a [i64], base: i64 },
}

/// Elements converted per write call: bounds the converter's scratch memory.
const CONVERT_CHUNK: usize = 16 * 1024;

fn write_mapped<T: Copy, U: Pod>(
    values: &[T],
    map: impl Fn(T) -> U,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut buf: Vec<U> = Vec::with_capacity(CONVERT_CHUNK.min(values.len()));
    for chunk in values.chunks(CONVERT_CHUNK) {
        buf.clear();
        buf.extend(chunk.iter().map(|&v| map(v)));
        out.write_all(as_bytes(&buf))?;
    }
    Ok(())
}

fn write_ints(values: &[i64], dtype: Dtype, out: &mut dyn Write) -> std::io::Result<()> {
    match dtype {
        Dtype::I16 => write_mapped(values, |v| v as i16, out),
        Dtype::I32 => write_mapped(values, |v| v as i32, out),
        _ => out.write_all(as_bytes(values)),
    }
}

fn write_floats(values: &[f64], dtype: Dtype, out: &mut dyn Write) -> std::io::Result<()> {
    match dtype {
        Dtype::F32 => write_mapped(values, |v| v as f32, out),
        _ => out.write_all(as_bytes(values)),
    }
}

impl Elements<'_> {
    fn count(&self) -> usize {
        match self {
            Elements::Bytes(v) => v.len(),
            Elements::Ints(v) | Elements::Offsets { values: v, .. } => v.len(),
            Elements::Floats(v) => v.len(),
            Elements::Sensors(v) => v.len(),
            Elements::Positions(v, _) => 3 * v.len(),
        }
    }

    fn write(&self, dtype: Dtype, out: &mut dyn Write) -> std::io::Result<()> {
        match *self {
            Elements::Bytes(v) => out.write_all(v),
            Elements::Ints(v) => write_ints(v, dtype, out),
            Elements::Sensors(v) => match dtype {
                Dtype::I16 => write_mapped(v, |s| s as i16, out),
                _ => out.write_all(as_bytes(v)),
            },
            Elements::Floats(v) => write_floats(v, dtype, out),
            Elements::Positions(sensors, g) => {
                for chunk in sensors.chunks(CONVERT_CHUNK) {
                    let xyz: Vec<f64> = chunk
                        .iter()
                        .flat_map(|&s| [g.x[s as usize], g.y[s as usize], g.z[s as usize]])
                        .collect();
                    write_floats(&xyz, dtype, out)?;
                }
                Ok(())
            }
            Elements::Offsets { values, base } => write_mapped(values, |v| v + base, out),
        }
    }
}

/// A tensor's elements, part after part, in one storage dtype.
struct Column<'a> {
    dtype: Dtype,
    parts: Vec<Elements<'a>>,
}

impl TensorBytes for Column<'_> {
    fn byte_len(&self) -> usize {
        self.parts.iter().map(|p| p.count()).sum::<usize>() * self.dtype.size()
    }

    fn write_to(&self, out: &mut dyn Write) -> std::io::Result<()> {
        self.parts.iter().try_for_each(|p| p.write(self.dtype, out))
    }
}

/// A writer that hashes what passes through it.
struct HashingWriter<'w, W: Write> {
    inner: &'w mut W,
    hasher: super::checksum::Checksum,
}

impl<W: Write> Write for HashingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The offsets of all parts as one run: each part's offsets after its leading 0, shifted
/// by the totals of the parts before it.
fn offset_parts<'a>(
    parts: &'a [PackedColumns],
    offsets: fn(&PackedColumns) -> &[i64],
    total: fn(&PackedColumns) -> usize,
) -> Vec<Elements<'a>> {
    let mut base = 0i64;
    let mut runs = vec![Elements::Ints(&[0])];
    for part in parts {
        runs.push(Elements::Offsets {
            values: &offsets(part)[1..],
            base,
        });
        base += total(part) as i64;
    }
    runs
}

/// Writes `contents` atomically to `path`, leaving the fsync to the caller (the converter
/// syncs every shard before it writes the manifest); returns its manifest entry.
pub fn write_shard(path: &Path, contents: &ShardContents) -> Result<ShardEntry> {
    let ShardContents {
        headers,
        parts,
        geometry,
        types,
        ..
    } = contents;
    let e: usize = parts.iter().map(|p| p.events()).sum();
    let d: usize = parts.iter().map(|p| p.doms()).sum();
    let p: usize = parts.iter().map(|p| p.pulses()).sum();
    assert_eq!(headers.len(), e, "one header per packed event");
    let column = |f: fn(&EventHeader) -> i64| headers.iter().map(f).collect::<Vec<i64>>();
    let event_id = column(|h| h.event_id);
    let batch_id = column(|h| h.batch_id);
    let first_row = column(|h| h.first_row as i64);
    let azimuth: Vec<f64> = headers.iter().map(|h| h.azimuth).collect();
    let zenith: Vec<f64> = headers.iter().map(|h| h.zenith).collect();
    let each = |f: fn(&PackedColumns) -> Elements| parts.iter().map(f).collect::<Vec<_>>();
    let one = |dtype, elements| Column {
        dtype,
        parts: vec![elements],
    };
    let columns: Vec<(&str, Column, Vec<usize>)> = vec![
        (
            names::EVENT_ID,
            one(Dtype::I64, Elements::Ints(&event_id)),
            vec![e],
        ),
        (
            names::EVENT_BATCH_ID,
            one(Dtype::I64, Elements::Ints(&batch_id)),
            vec![e],
        ),
        (
            names::EVENT_FIRST_ROW,
            one(Dtype::I64, Elements::Ints(&first_row)),
            vec![e],
        ),
        (
            names::EVENT_DOM_OFFSETS,
            Column {
                dtype: Dtype::I64,
                parts: offset_parts(parts, |c| &c.event_dom_offsets, PackedColumns::doms),
            },
            vec![e + 1],
        ),
        (
            names::DOM_SENSOR_ID,
            Column {
                dtype: types.sensor_id,
                parts: each(|c| Elements::Sensors(&c.dom_sensor_id)),
            },
            vec![d],
        ),
        (
            names::DOM_POSITION,
            Column {
                dtype: types.position,
                parts: parts
                    .iter()
                    .map(|c| Elements::Positions(&c.dom_sensor_id, geometry))
                    .collect(),
            },
            vec![d, 3],
        ),
        (
            names::DOM_PULSE_OFFSETS,
            Column {
                dtype: Dtype::I64,
                parts: offset_parts(parts, |c| &c.dom_pulse_offsets, PackedColumns::pulses),
            },
            vec![d + 1],
        ),
        (
            names::PULSE_TIME,
            Column {
                dtype: types.time,
                parts: each(|c| Elements::Ints(&c.time)),
            },
            vec![p],
        ),
        (
            names::PULSE_CHARGE,
            Column {
                dtype: types.charge,
                parts: each(|c| Elements::Floats(&c.charge)),
            },
            vec![p],
        ),
        (
            names::PULSE_AUXILIARY,
            Column {
                dtype: Dtype::BOOL,
                parts: each(|c| Elements::Bytes(&c.auxiliary)),
            },
            vec![p],
        ),
    ];
    let labels = [
        (
            names::EVENT_AZIMUTH,
            one(Dtype::F64, Elements::Floats(&azimuth)),
            vec![e],
        ),
        (
            names::EVENT_ZENITH,
            one(Dtype::F64, Elements::Floats(&zenith)),
            vec![e],
        ),
    ];
    let stored = columns.iter().chain(labels.iter().filter(|_| types.labels));
    let tensors: Vec<TensorOut> = stored
        .map(|(name, column, shape)| TensorOut {
            name: name.to_string(),
            dtype: column.dtype,
            shape: shape.clone(),
            data: column,
        })
        .collect();
    let (bytes, xxh3) = super::atomic::write_atomic(path, Durability::Deferred, |w| {
        let mut hashing = HashingWriter {
            inner: w,
            hasher: super::checksum::Checksum::new(),
        };
        let bytes = safetensors::write(&mut hashing, &contents.metadata, &tensors)
            .map_err(|err| Error::io(path, err))?;
        Ok((bytes, hashing.hasher.hex()))
    })?;
    Ok(ShardEntry {
        file: path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string(),
        events: e as u64,
        doms: d as u64,
        pulses: p as u64,
        bytes,
        xxh3,
    })
}

/// An integer column stored at one of several widths.
#[derive(Debug, Clone, Copy)]
pub enum IntColumn<'a> {
    /// Stored as I16.
    I16(&'a [i16]),
    /// Stored as I32.
    I32(&'a [i32]),
    /// Stored as I64.
    I64(&'a [i64]),
}

impl<'a> IntColumn<'a> {
    /// The stored bytes and element type.
    pub fn raw(&self) -> (&'a [u8], Dtype) {
        match *self {
            IntColumn::I16(v) => (as_bytes(v), Dtype::I16),
            IntColumn::I32(v) => (as_bytes(v), Dtype::I32),
            IntColumn::I64(v) => (as_bytes(v), Dtype::I64),
        }
    }

    /// Views `bytes` (aligned, of whole elements) as a column of `dtype`.
    pub fn from_raw(bytes: &'a [u8], dtype: Dtype) -> Option<IntColumn<'a>> {
        Some(match dtype {
            Dtype::I16 => IntColumn::I16(try_cast(bytes)?),
            Dtype::I32 => IntColumn::I32(try_cast(bytes)?),
            Dtype::I64 => IntColumn::I64(try_cast(bytes)?),
            _ => return None,
        })
    }

    /// Element `i`, widened.
    pub fn get(&self, i: usize) -> i64 {
        match self {
            IntColumn::I16(v) => v[i] as i64,
            IntColumn::I32(v) => v[i] as i64,
            IntColumn::I64(v) => v[i],
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            IntColumn::I16(v) => v.len(),
            IntColumn::I32(v) => v.len(),
            IntColumn::I64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A float column stored at one of several widths.
#[derive(Debug, Clone, Copy)]
pub enum FloatColumn<'a> {
    /// Stored as F32.
    F32(&'a [f32]),
    /// Stored as F64.
    F64(&'a [f64]),
}

impl<'a> FloatColumn<'a> {
    /// The stored bytes and element type.
    pub fn raw(&self) -> (&'a [u8], Dtype) {
        match *self {
            FloatColumn::F32(v) => (as_bytes(v), Dtype::F32),
            FloatColumn::F64(v) => (as_bytes(v), Dtype::F64),
        }
    }

    /// Views `bytes` (aligned, of whole elements) as a column of `dtype`.
    pub fn from_raw(bytes: &'a [u8], dtype: Dtype) -> Option<FloatColumn<'a>> {
        Some(match dtype {
            Dtype::F32 => FloatColumn::F32(try_cast(bytes)?),
            Dtype::F64 => FloatColumn::F64(try_cast(bytes)?),
            _ => return None,
        })
    }

    /// Element `i`, widened (exactly).
    pub fn get(&self, i: usize) -> f64 {
        match self {
            FloatColumn::F32(v) => v[i] as f64,
            FloatColumn::F64(v) => v[i],
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            FloatColumn::F32(v) => v.len(),
            FloatColumn::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Typed, validated views of a shard's tensors. Construction checks shapes and offsets, so
/// indexing through the offsets never goes out of bounds.
#[derive(Debug, Clone, Copy)]
pub struct ShardView<'a> {
    /// `[E]`.
    pub event_id: &'a [i64],
    /// `[E]`.
    pub event_batch_id: &'a [i64],
    /// `[E]`.
    pub event_first_row: &'a [i64],
    /// `[E]` when labelled.
    pub event_azimuth: Option<&'a [f64]>,
    /// `[E]` when labelled.
    pub event_zenith: Option<&'a [f64]>,
    /// `[E+1]`.
    pub event_dom_offsets: &'a [i64],
    /// `[D]`.
    pub dom_sensor_id: IntColumn<'a>,
    /// `[D*3]`, x,y,z per DOM.
    pub dom_position: FloatColumn<'a>,
    /// `[D+1]`.
    pub dom_pulse_offsets: &'a [i64],
    /// `[P]`.
    pub pulse_time: IntColumn<'a>,
    /// `[P]`.
    pub pulse_charge: FloatColumn<'a>,
    /// `[P]`, 0 or 1.
    pub pulse_auxiliary: &'a [u8],
}

struct Tensors<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    header: &'a Header,
}

impl<'a> Tensors<'a> {
    fn info(&self, name: &str) -> Result<&'a super::safetensors::TensorInfo> {
        self.header
            .tensors
            .get(name)
            .ok_or_else(|| Error::shard(self.path, format!("missing tensor `{name}`")))
    }

    fn typed<T: Pod>(&self, name: &str, dtype: Dtype, len: Option<usize>) -> Result<&'a [T]> {
        let info = self.info(name)?;
        if info.dtype != dtype {
            return Err(Error::shard(
                self.path,
                format!("tensor `{name}` is {:?}, expected {dtype:?}", info.dtype),
            ));
        }
        let values = try_cast::<T>(&self.bytes[info.range.clone()]).ok_or_else(|| {
            Error::shard(
                self.path,
                format!("tensor `{name}` is not aligned to its element size"),
            )
        })?;
        if let Some(len) = len {
            if values.len() != len {
                return Err(Error::shard(
                    self.path,
                    format!(
                        "tensor `{name}` has {} elements, expected {len}",
                        values.len()
                    ),
                ));
            }
        }
        Ok(values)
    }

    fn ints(&self, name: &str, len: usize) -> Result<IntColumn<'a>> {
        Ok(match self.info(name)?.dtype {
            Dtype::I16 => IntColumn::I16(self.typed(name, Dtype::I16, Some(len))?),
            Dtype::I32 => IntColumn::I32(self.typed(name, Dtype::I32, Some(len))?),
            _ => IntColumn::I64(self.typed(name, Dtype::I64, Some(len))?),
        })
    }

    fn floats(&self, name: &str, len: usize) -> Result<FloatColumn<'a>> {
        Ok(match self.info(name)?.dtype {
            Dtype::F32 => FloatColumn::F32(self.typed(name, Dtype::F32, Some(len))?),
            _ => FloatColumn::F64(self.typed(name, Dtype::F64, Some(len))?),
        })
    }
}

/// Checks that `offsets` start at 0, never decrease and end at `total`.
fn check_offsets_of(path: &Path, name: &str, offsets: &[i64], total: usize) -> Result<()> {
    if offsets.first() != Some(&0) {
        return Err(Error::shard(path, format!("`{name}` does not start at 0")));
    }
    if let Some(i) = offsets.windows(2).position(|w| w[1] <= w[0]) {
        return Err(Error::shard(
            path,
            format!("`{name}` is not increasing at index {i} (empty entry or decreasing)"),
        ));
    }
    if *offsets.last().expect("non-empty") != total as i64 {
        return Err(Error::shard(
            path,
            format!(
                "`{name}` ends at {}, expected {total}",
                offsets.last().unwrap()
            ),
        ));
    }
    Ok(())
}

impl<'a> ShardView<'a> {
    /// Validates `bytes` (a whole shard file) and returns typed views into it.
    pub fn parse(path: &'a Path, bytes: &'a [u8], header: &'a Header) -> Result<ShardView<'a>> {
        Self::parse_with(path, bytes, header, true)
    }

    /// As [`ShardView::parse`]; `check_offsets: false` skips the scans of the offset arrays
    /// (O(events + DOMs)), for a shard already validated once and immutable since.
    pub fn parse_with(
        path: &'a Path,
        bytes: &'a [u8],
        header: &'a Header,
        check_offsets: bool,
    ) -> Result<ShardView<'a>> {
        let t = Tensors {
            path,
            bytes,
            header,
        };
        let event_id: &[i64] = t.typed(names::EVENT_ID, Dtype::I64, None)?;
        let e = event_id.len();
        let event_dom_offsets = t.typed(names::EVENT_DOM_OFFSETS, Dtype::I64, Some(e + 1))?;
        let d = t
            .info(names::DOM_SENSOR_ID)?
            .shape
            .first()
            .copied()
            .unwrap_or(0);
        let dom_pulse_offsets = t.typed(names::DOM_PULSE_OFFSETS, Dtype::I64, Some(d + 1))?;
        let p = t
            .info(names::PULSE_TIME)?
            .shape
            .first()
            .copied()
            .unwrap_or(0);
        if check_offsets {
            check_offsets_of(path, names::EVENT_DOM_OFFSETS, event_dom_offsets, d)?;
            check_offsets_of(path, names::DOM_PULSE_OFFSETS, dom_pulse_offsets, p)?;
        }
        let labels = header.tensors.contains_key(names::EVENT_AZIMUTH);
        let label = |name| {
            if labels {
                t.typed(name, Dtype::F64, Some(e)).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(ShardView {
            event_id,
            event_batch_id: t.typed(names::EVENT_BATCH_ID, Dtype::I64, Some(e))?,
            event_first_row: t.typed(names::EVENT_FIRST_ROW, Dtype::I64, Some(e))?,
            event_azimuth: label(names::EVENT_AZIMUTH)?,
            event_zenith: label(names::EVENT_ZENITH)?,
            event_dom_offsets,
            dom_sensor_id: t.ints(names::DOM_SENSOR_ID, d)?,
            dom_position: t.floats(names::DOM_POSITION, 3 * d)?,
            dom_pulse_offsets,
            pulse_time: t.ints(names::PULSE_TIME, p)?,
            pulse_charge: t.floats(names::PULSE_CHARGE, p)?,
            pulse_auxiliary: t.typed(names::PULSE_AUXILIARY, Dtype::BOOL, Some(p))?,
        })
    }

    /// The number of events.
    pub fn events(&self) -> usize {
        self.event_id.len()
    }

    /// The number of DOMs.
    pub fn doms(&self) -> usize {
        self.dom_sensor_id.len()
    }

    /// The number of pulses.
    pub fn pulses(&self) -> usize {
        self.pulse_time.len()
    }

    /// The DOM index range of event `e`.
    pub fn dom_range(&self, e: usize) -> std::ops::Range<usize> {
        self.event_dom_offsets[e] as usize..self.event_dom_offsets[e + 1] as usize
    }

    /// The pulse index range of event `e` (all its DOMs' pulses).
    pub fn event_pulse_range(&self, e: usize) -> std::ops::Range<usize> {
        let doms = self.dom_range(e);
        self.dom_pulse_offsets[doms.start] as usize..self.dom_pulse_offsets[doms.end] as usize
    }

    /// The pulse index range of DOM `d`.
    pub fn pulse_range(&self, d: usize) -> std::ops::Range<usize> {
        self.dom_pulse_offsets[d] as usize..self.dom_pulse_offsets[d + 1] as usize
    }

    /// The header of event `e`.
    pub fn header(&self, e: usize) -> EventHeader {
        EventHeader {
            event_id: self.event_id[e],
            batch_id: self.event_batch_id[e],
            first_row: self.event_first_row[e] as u64,
            azimuth: self.event_azimuth.map_or(f64::NAN, |a| a[e]),
            zenith: self.event_zenith.map_or(f64::NAN, |z| z[e]),
        }
    }
}
