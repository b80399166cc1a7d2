//! Writes one shard from packed columns (the layout is in [`crate::format::shard`]):
//! whole columns, each converted to its storage width while it is written, so a narrowed
//! copy never exists in memory as a whole, and hashed on the way to the disk.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::event::EventHeader;
use crate::format::atomic::{write_atomic, Durability};
use crate::format::checksum::Checksum;
use crate::format::names;
use crate::format::pod::{as_bytes, Pod};
use crate::format::safetensors::{self, Dtype, TensorBytes, TensorOut};
use crate::format::shard::MAX_SHARD_ITEMS;
use crate::format::{ShardEntry, StorageTypes};
use crate::pack::PackedColumns;

/// Everything a shard holds, before writing. The packed columns may come in several
/// parts (packed in parallel); the shard holds their concatenation.
pub struct ShardContents<'a> {
    /// Event headers in stored order (all parts).
    pub headers: &'a [EventHeader],
    /// Packed columns, part after part.
    pub parts: &'a [PackedColumns],
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
    /// Offsets of one part, shifted by the totals of the parts before it; stored as I32.
    Offsets {
        values: &'a [i64],
        base: i64,
    },
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
            Elements::Offsets { values, base } => write_mapped(values, |v| (v + base) as i32, out),
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
    hasher: Checksum,
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
    let mut runs = vec![Elements::Offsets {
        values: &[0],
        base: 0,
    }];
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
/// syncs every shard before it writes the manifest); returns its manifest entry. A shard
/// of [`MAX_SHARD_ITEMS`] DOMs or pulses or more is refused: its offsets would not fit I32.
pub fn write_shard(path: &Path, contents: &ShardContents) -> Result<ShardEntry> {
    let ShardContents {
        headers,
        parts,
        types,
        ..
    } = contents;
    let e: usize = parts.iter().map(|p| p.events()).sum();
    let d: usize = parts.iter().map(|p| p.doms()).sum();
    let p: usize = parts.iter().map(|p| p.pulses()).sum();
    assert_eq!(headers.len(), e, "one header per packed event");
    if d.max(p) as u64 > MAX_SHARD_ITEMS {
        return Err(Error::config(
            "shard_size",
            format!(
                "{}: {d} DOMs and {p} pulses do not fit one shard's I32 offsets (at most \
             {MAX_SHARD_ITEMS}): convert with a smaller --shard-size",
                path.display()
            ),
        ));
    }
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
                dtype: Dtype::I32,
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
            names::DOM_PULSE_OFFSETS,
            Column {
                dtype: Dtype::I32,
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
    write_tensors(path, &contents.metadata, &tensors, [e, d, p])
}

/// Writes a shard of `tensors` atomically to `path` (fsync left to the caller), hashing it
/// on the way; returns its manifest entry, with its `[events, DOMs, pulses]` counts.
pub(crate) fn write_tensors(
    path: &Path,
    metadata: &BTreeMap<String, String>,
    tensors: &[TensorOut],
    [events, doms, pulses]: [usize; 3],
) -> Result<ShardEntry> {
    let (bytes, xxh3) = write_atomic(path, Durability::Deferred, |w| {
        let mut hashing = HashingWriter {
            inner: w,
            hasher: Checksum::new(),
        };
        let bytes = safetensors::write(&mut hashing, metadata, tensors)
            .map_err(|err| Error::io(path, err))?;
        Ok((bytes, hashing.hasher.hex()))
    })?;
    Ok(ShardEntry {
        file: path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string(),
        events: events as u64,
        doms: doms as u64,
        pulses: pulses as u64,
        bytes,
        xxh3,
    })
}
