//! The sensor table: every sensor's position, stored once per dataset in
//! `geometry.safetensors` beside the shards, instead of once per DOM in every shard.
//!
//! One tensor, `sensor_position` `[S, 3]` (F64, or F32 when every coordinate round-trips
//! exactly or the conversion was `--lossy`): row `s` holds x, y, z in metres of sensor id
//! `s`, NaN for ids the geometry does not list. A shard's `dom_sensor_id` indexes it
//! directly: `positions[dom_sensor_id]` in numpy.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::columns::FloatColumn;
use super::names::SENSOR_POSITION;
use super::pod::{try_cast, try_cast_mut, LineAligned, Pod};
use super::safetensors::{self, Dtype, Raw, TensorOut};
use super::shard::{ShardProblem, TensorCheck};
use super::{checksum, format_metadata};
use crate::error::{Error, IoContext, Result};

/// The sensor table's file name inside a dataset directory.
pub const SENSOR_TABLE_FILE: &str = "geometry.safetensors";

/// What the manifest records of the sensor table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SensorTableEntry {
    /// File name inside the dataset directory.
    pub file: String,
    /// Rows: the largest sensor id plus one.
    pub rows: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// XXH3-64 of the whole file, hex.
    pub xxh3: String,
}

/// Positions at their stored width, 3 per row.
#[derive(Debug, Clone, PartialEq)]
enum Positions {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// The same rows padded to four values (the fourth 0), owned, starting on a cache line.
#[derive(Debug, Clone, PartialEq)]
enum Padded {
    F32(PaddedRows<f32>),
    F64(PaddedRows<f64>),
}

/// Rows of four values on memory that starts on a cache line, so that no row straddles
/// two lines (in a `Vec<[f64; 4]>` of the real table's size every other row did: the
/// allocator served it 16 bytes past a line).
#[derive(Debug, Clone, PartialEq)]
struct PaddedRows<T> {
    bytes: LineAligned,
    values: PhantomData<T>,
}

impl<T: Pod> PaddedRows<T> {
    /// `xyz` (3 per row) as rows of four, the fourth zero.
    fn new(xyz: &[T]) -> PaddedRows<T> {
        let (xyz, _) = xyz.as_chunks::<3>();
        let mut bytes = LineAligned::zeroed(std::mem::size_of_val(xyz) / 3 * 4);
        let values = try_cast_mut::<T>(bytes.bytes_mut()).expect("line-aligned memory");
        for (row, xyz) in values.as_chunks_mut::<4>().0.iter_mut().zip(xyz) {
            // The fourth stays zero bytes: 0.0 in either width.
            row[..3].copy_from_slice(xyz);
        }
        PaddedRows {
            bytes,
            values: PhantomData,
        }
    }

    fn rows(&self) -> &[[T; 4]] {
        try_cast::<T>(self.bytes.bytes())
            .expect("line-aligned memory")
            .as_chunks::<4>()
            .0
    }
}

/// The table's rows padded to four values, at the stored width: what a lookup per DOM
/// reads. A 24-byte row of three F64 straddles two cache lines one time in four, a
/// 32-byte row never once the rows start on a line (they do); one thread's gather looked
/// positions up 3-8% faster this way (2-core Ice Lake, both forms alternated in one
/// process, docs/results.md), and the loader 0-2% faster again once the rows of the real
/// table were moved from 16 bytes past a line onto one (2-core Zen 5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LookupRows<'a> {
    /// Rows of an F32 table.
    F32(&'a [[f32; 4]]),
    /// Rows of an F64 table.
    F64(&'a [[f64; 4]]),
}

/// Every sensor's position, indexed by sensor id.
#[derive(Debug, Clone, PartialEq)]
pub struct SensorTable {
    positions: Positions,
    padded: Padded,
}

impl SensorTable {
    /// A table of `xyz` (x, y, z per row; NaN rows for unlisted ids) stored as `dtype`
    /// (F32 narrows each value; the caller decides whether that is exact or allowed).
    pub fn new(xyz: &[f64], dtype: Dtype) -> SensorTable {
        assert_eq!(xyz.len() % 3, 0, "three coordinates per sensor");
        let positions = match dtype {
            Dtype::F32 => Positions::F32(xyz.iter().map(|&v| v as f32).collect()),
            Dtype::F64 => Positions::F64(xyz.to_vec()),
            other => panic!("sensor positions are F32 or F64, not {other:?}"),
        };
        SensorTable::of(positions)
    }

    /// A table of `positions`, with its lookup rows made from them.
    fn of(positions: Positions) -> SensorTable {
        let padded = match &positions {
            Positions::F32(v) => Padded::F32(PaddedRows::new(v)),
            Positions::F64(v) => Padded::F64(PaddedRows::new(v)),
        };
        SensorTable { positions, padded }
    }

    /// The rows padded to four values, for lookups by sensor id.
    pub fn lookup_rows(&self) -> LookupRows<'_> {
        match &self.padded {
            Padded::F32(rows) => LookupRows::F32(rows.rows()),
            Padded::F64(rows) => LookupRows::F64(rows.rows()),
        }
    }

    /// Rows (the largest sensor id plus one).
    pub fn rows(&self) -> usize {
        self.column().len() / 3
    }

    /// The stored element type.
    pub fn dtype(&self) -> Dtype {
        self.column().raw().1
    }

    /// All positions, row-major `[rows, 3]`, at the stored width.
    pub fn column(&self) -> FloatColumn<'_> {
        match &self.positions {
            Positions::F32(v) => FloatColumn::F32(v),
            Positions::F64(v) => FloatColumn::F64(v),
        }
    }

    /// The position of `sensor`, widened exactly; `None` outside the table or for an id
    /// the geometry does not list.
    pub fn position(&self, sensor: i64) -> Option<[f64; 3]> {
        let row = usize::try_from(sensor).ok().filter(|&r| r < self.rows())?;
        let xyz = [0, 1, 2].map(|k| self.column().get(3 * row + k));
        (!xyz[0].is_nan()).then_some(xyz)
    }

    /// Writes the table durably to `dir/geometry.safetensors`; returns its manifest entry.
    pub fn write(&self, dir: &Path) -> Result<SensorTableEntry> {
        let path = dir.join(SENSOR_TABLE_FILE);
        let (bytes, dtype) = self.column().raw();
        let raw = Raw(bytes);
        let tensors = [TensorOut {
            name: SENSOR_POSITION.to_string(),
            dtype,
            shape: vec![self.rows(), 3],
            data: &raw,
        }];
        let metadata = format_metadata(BTreeMap::new());
        let mut file = Vec::new();
        safetensors::write(&mut file, &metadata, &tensors).map_err(|e| Error::io(&path, e))?;
        super::atomic::write_bytes_atomic(&path, &file)?;
        Ok(SensorTableEntry {
            file: SENSOR_TABLE_FILE.to_string(),
            rows: self.rows() as u64,
            bytes: file.len() as u64,
            xxh3: checksum::of_bytes(&file),
        })
    }

    /// Reads `dir/<entry.file>`, checks its size, checksum (when asked) and structure.
    pub fn read(dir: &Path, entry: &SensorTableEntry, check_checksum: bool) -> Result<SensorTable> {
        let path = dir.join(&entry.file);
        let bytes = std::fs::read(&path).at(&path)?;
        if bytes.len() as u64 != entry.bytes {
            return Err(Error::shard(
                &path,
                ShardProblem::Size {
                    found: bytes.len() as u64,
                    expected: entry.bytes,
                },
            ));
        }
        if check_checksum {
            checksum::verify(&path, &bytes, &entry.xxh3)?;
        }
        let table = SensorTable::parse(&bytes).map_err(|p| Error::shard(&path, p))?;
        if table.rows() as u64 != entry.rows {
            return Err(Error::shard(
                &path,
                ShardProblem::Shape {
                    tensor: SENSOR_POSITION.into(),
                    found: vec![table.rows(), 3],
                    expected: vec![entry.rows as usize, 3],
                },
            ));
        }
        Ok(table)
    }

    /// Validates a whole `geometry.safetensors` file held in `bytes`.
    pub fn parse(bytes: &[u8]) -> std::result::Result<SensorTable, ShardProblem> {
        let header = safetensors::parse(bytes)?;
        let check = TensorCheck::new(&header, &[&[SENSOR_POSITION]])?;
        let info = check.info(SENSOR_POSITION)?;
        let rows = info.shape.first().copied().unwrap_or(0);
        check.shape(SENSOR_POSITION, &[rows, 3])?;
        if !matches!(info.dtype, Dtype::F32 | Dtype::F64) {
            return Err(ShardProblem::Dtype {
                tensor: SENSOR_POSITION.into(),
                found: info.dtype,
                expected: "F32 or F64",
            });
        }
        let column = FloatColumn::from_raw(&bytes[info.range.clone()], info.dtype).ok_or(
            ShardProblem::Misaligned {
                tensor: SENSOR_POSITION.into(),
            },
        )?;
        let positions = match column {
            FloatColumn::F32(v) => Positions::F32(v.to_vec()),
            FloatColumn::F64(v) => Positions::F64(v.to_vec()),
        };
        Ok(SensorTable::of(positions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::pod::CACHE_LINE;

    fn table() -> SensorTable {
        let nan = f64::NAN;
        SensorTable::new(
            &[1.5, -2.25, 3.0, nan, nan, nan, -256.14, 0.0, 496.03],
            Dtype::F64,
        )
    }

    #[test]
    fn lookup_rows_are_the_stored_rows_padded_with_a_zero() {
        let nan = f64::NAN;
        let xyz = [1.5, -2.25, 3.0, nan, nan, nan, -256.14, 0.0, 496.03];
        for dtype in [Dtype::F64, Dtype::F32] {
            let t = SensorTable::new(&xyz, dtype);
            let padded: Vec<[f64; 4]> = match (t.lookup_rows(), dtype) {
                (LookupRows::F64(r), Dtype::F64) => r.to_vec(),
                (LookupRows::F32(r), Dtype::F32) => r.iter().map(|r| r.map(f64::from)).collect(),
                (other, _) => panic!("{dtype:?} table gave {other:?}"),
            };
            assert_eq!(padded.len(), 3);
            let start = match t.lookup_rows() {
                LookupRows::F64(r) => r.as_ptr() as usize,
                LookupRows::F32(r) => r.as_ptr() as usize,
            };
            assert_eq!(
                start % CACHE_LINE,
                0,
                "{dtype:?} rows start on a cache line"
            );
            for (row, p) in padded.iter().enumerate() {
                assert_eq!(p[3], 0.0, "row {row}");
                for (k, &value) in p[..3].iter().enumerate() {
                    let stored = t.column().get(3 * row + k);
                    assert!(
                        value == stored || (value.is_nan() && stored.is_nan()),
                        "{dtype:?} row {row} value {k}: {value} against {stored}"
                    );
                }
            }
            // The same rows when the table is read back from its file.
            let dir = tempfile::tempdir().unwrap();
            let entry = t.write(dir.path()).unwrap();
            let back = SensorTable::read(dir.path(), &entry, true).unwrap();
            assert_eq!(
                format!("{:?}", back.lookup_rows()),
                format!("{:?}", t.lookup_rows())
            );
        }
    }

    #[test]
    fn round_trips_through_its_file_and_checks_it() {
        let dir = tempfile::tempdir().unwrap();
        let t = table();
        let entry = t.write(dir.path()).unwrap();
        assert_eq!(entry.rows, 3);
        let back = SensorTable::read(dir.path(), &entry, true).unwrap();
        assert_eq!(back.dtype(), Dtype::F64);
        assert_eq!(back.position(0), Some([1.5, -2.25, 3.0]));
        assert_eq!(back.position(1), None, "an unlisted id");
        assert_eq!(back.position(2), Some([-256.14, 0.0, 496.03]));
        assert_eq!(back.position(3), None);
        assert_eq!(back.position(-1), None);
        let path = dir.path().join(SENSOR_TABLE_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = SensorTable::read(dir.path(), &entry, true).unwrap_err();
        assert!(matches!(err, Error::Checksum { .. }), "{err}");
        let wrong_rows = SensorTableEntry { rows: 4, ..entry };
        let err = SensorTable::read(dir.path(), &wrong_rows, false).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Shard {
                    problem: ShardProblem::Shape { .. },
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn narrows_to_f32_when_asked() {
        let t = SensorTable::new(&[0.5, 1.0, 2.0], Dtype::F32);
        assert_eq!(t.dtype(), Dtype::F32);
        assert_eq!(t.position(0), Some([0.5, 1.0, 2.0]));
    }

    #[test]
    fn rejects_what_is_not_a_sensor_table() {
        let file = |name: &str, dtype: Dtype, shape: Vec<usize>, data: &[u8]| {
            let raw = Raw(data);
            let tensors = [TensorOut {
                name: name.into(),
                dtype,
                shape,
                data: &raw,
            }];
            let mut out = Vec::new();
            safetensors::write(&mut out, &format_metadata(BTreeMap::new()), &tensors).unwrap();
            out
        };
        assert_eq!(
            SensorTable::parse(&file(SENSOR_POSITION, Dtype::I32, vec![2, 3], &[0; 24])),
            Err(ShardProblem::Dtype {
                tensor: SENSOR_POSITION.into(),
                found: Dtype::I32,
                expected: "F32 or F64"
            })
        );
        assert!(matches!(
            SensorTable::parse(&file(SENSOR_POSITION, Dtype::F32, vec![3, 2], &[0; 24])),
            Err(ShardProblem::Shape { .. })
        ));
        assert_eq!(
            SensorTable::parse(&file("positions", Dtype::F32, vec![2, 3], &[0; 24])),
            Err(ShardProblem::ExtraTensor("positions".into()))
        );
    }
}
