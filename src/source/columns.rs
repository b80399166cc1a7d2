//! Reading named Parquet columns as canonical values, whatever the writer chose.
//!
//! Integers of any width (INT32 or INT64, signed or unsigned, dictionary-encoded or not) come
//! out as `i64`, floats of any width (half, single, double) as `f64`, booleans as `bool`.
//! Nullable columns are accepted as long as they hold no null; the first null is reported
//! with its row, and so is an unsigned 64-bit value past `i64::MAX`. The values come from
//! the parquet crate's own column readers, page by page, with no Arrow arrays in between.
//!
//! A corrupt file is an error naming it, never a panic: the parquet crate asserts on some
//! footers (a column chunk at a negative offset) rather than failing, so the footer's byte
//! ranges are checked before any column is read (`check_footer`), and a panic the decoder
//! still raises on corrupt data becomes the same error (`guarded`).

use std::fs::File;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use parquet::basic::{ConvertedType, LogicalType, Repetition, Type as Physical};
use parquet::column::reader::{ColumnReader as ChunkReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::{ColumnDescriptor, Type};

use crate::error::{Error, IoContext, Result};

/// The canonical kind a column is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Any integer type, read as `i64`.
    Int,
    /// Any floating-point type, read as `f64`.
    Float,
    /// Boolean.
    Bool,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Int => "an integer type",
            Kind::Float => "a floating-point type",
            Kind::Bool => "boolean",
        }
    }
}

/// A column to read.
#[derive(Debug, Clone, Copy)]
pub struct ColumnSpec {
    /// Its name in the file.
    pub name: &'static str,
    /// How to read it.
    pub kind: Kind,
}

/// `event_id`, a column of both the batch files and the meta.
pub const EVENT_ID: ColumnSpec = ColumnSpec {
    name: "event_id",
    kind: Kind::Int,
};

/// How a column's values are stored, among those read as a [`Kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    /// INT32, read as a signed or an unsigned 32-bit integer.
    Int32 { unsigned: bool },
    /// INT64, read as a signed or an unsigned 64-bit integer.
    Int64 { unsigned: bool },
    /// FLOAT.
    Float,
    /// DOUBLE.
    Double,
    /// FIXED_LEN_BYTE_ARRAY(2) annotated Float16 (IEEE 754 half precision, little-endian).
    Half,
    /// BOOLEAN.
    Bool,
}

impl Stored {
    /// How the leaf `column` is stored, when that is a plain number or boolean (no date,
    /// time, decimal or string annotation); `None` otherwise.
    fn of(column: &ColumnDescriptor) -> Option<Stored> {
        // Some(unsigned) for an integer annotation, None for none.
        let integer = match (column.logical_type_ref(), column.converted_type()) {
            (Some(LogicalType::Integer(int)), _) => Some(!int.is_signed),
            (Some(LogicalType::Float16), _) => {
                let half = column.physical_type() == Physical::FIXED_LEN_BYTE_ARRAY
                    && column.type_length() == 2;
                return half.then_some(Stored::Half);
            }
            (Some(_), _) => return None,
            (None, ConvertedType::NONE) => None,
            (
                None,
                ConvertedType::INT_8
                | ConvertedType::INT_16
                | ConvertedType::INT_32
                | ConvertedType::INT_64,
            ) => Some(false),
            (
                None,
                ConvertedType::UINT_8
                | ConvertedType::UINT_16
                | ConvertedType::UINT_32
                | ConvertedType::UINT_64,
            ) => Some(true),
            (None, _) => return None,
        };
        let unsigned = integer.unwrap_or(false);
        match (column.physical_type(), integer) {
            (Physical::INT32, _) => Some(Stored::Int32 { unsigned }),
            (Physical::INT64, _) => Some(Stored::Int64 { unsigned }),
            (Physical::FLOAT, None) => Some(Stored::Float),
            (Physical::DOUBLE, None) => Some(Stored::Double),
            (Physical::BOOLEAN, None) => Some(Stored::Bool),
            _ => None,
        }
    }

    fn kind(self) -> Kind {
        match self {
            Stored::Int32 { .. } | Stored::Int64 { .. } => Kind::Int,
            Stored::Float | Stored::Double | Stored::Half => Kind::Float,
            Stored::Bool => Kind::Bool,
        }
    }
}

/// A top-level field's type as an error message names it: the Parquet physical type and its
/// annotation (`BYTE_ARRAY (String)`, `INT32 (Integer(IntType { bit_width: 16, .. }))`).
fn describe_type(field: &Type) -> String {
    if field.is_group() {
        return "a group of nested columns".into();
    }
    let info = field.get_basic_info();
    let repeated = if info.repetition() == Repetition::REPEATED {
        "repeated "
    } else {
        ""
    };
    let physical = format!("{:?}", field.get_physical_type());
    match (info.logical_type_ref(), info.converted_type()) {
        (Some(logical), _) => format!("{repeated}{physical} ({logical:?})"),
        (None, ConvertedType::NONE) => format!("{repeated}{physical}"),
        (None, converted) => format!("{repeated}{physical} ({converted:?})"),
    }
}

/// An open Parquet file: its footer, read once.
pub struct ParquetSource {
    path: PathBuf,
    file: SerializedFileReader<File>,
}

impl ParquetSource {
    /// Opens `path` and decodes its footer.
    pub fn open(path: &Path) -> Result<ParquetSource> {
        let file = File::open(path).at(path)?;
        let file_bytes = file.metadata().at(path)?.len();
        let file = guarded(path, || {
            SerializedFileReader::new(file).map_err(|e| Error::parquet(path, e))
        })?;
        check_footer(file.metadata(), file_bytes)
            .map_err(|problem| Error::parquet(path, ParquetError::General(problem)))?;
        Ok(ParquetSource {
            path: path.to_path_buf(),
            file,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The decoded footer.
    pub fn metadata(&self) -> &ParquetMetaData {
        self.file.metadata()
    }

    /// The number of rows in the file.
    pub fn num_rows(&self) -> u64 {
        self.metadata().file_metadata().num_rows().max(0) as u64
    }

    /// The top-level field named `name`, if the file has one.
    fn field(&self, name: &str) -> Option<&Type> {
        let schema = self.metadata().file_metadata().schema_descr();
        schema
            .root_schema()
            .get_fields()
            .iter()
            .find(|field| field.name() == name)
            .map(|field| field.as_ref())
    }

    /// Whether the file has a column named `name`.
    pub fn has_column(&self, name: &str) -> bool {
        self.field(name).is_some()
    }

    /// The leaf index of `spec`'s column and how its values are stored. Fails on a missing
    /// column, or one whose type is not `spec`'s kind (a nested or repeated one included).
    fn locate(&self, spec: &ColumnSpec) -> Result<(usize, Stored)> {
        let field = self.field(spec.name).ok_or_else(|| Error::MissingColumn {
            path: self.path.clone(),
            column: spec.name,
        })?;
        let schema = self.metadata().file_metadata().schema_descr();
        let leaf =
            (0..schema.num_columns()).find(|&i| schema.column(i).path().parts() == [spec.name]);
        let located = leaf
            .filter(|&i| schema.column(i).max_rep_level() == 0)
            .and_then(|i| Some((i, Stored::of(&schema.column(i))?)));
        match located {
            Some((leaf, stored)) if stored.kind() == spec.kind => Ok((leaf, stored)),
            _ => Err(Error::ColumnType {
                path: self.path.clone(),
                column: spec.name,
                found: describe_type(field),
                expected: spec.kind.describe(),
            }),
        }
    }

    /// Reads `columns` (in that order) from the chosen row groups (all when `None`), in
    /// file order, up to `batch_rows` rows at a time (a batch never spans row groups). Fails
    /// at once on a missing or mistyped column.
    pub fn read(
        self,
        columns: &[ColumnSpec],
        row_groups: Option<Vec<usize>>,
        batch_rows: usize,
    ) -> Result<ColumnReader> {
        let columns = columns
            .iter()
            .map(|spec| {
                let (leaf, stored) = self.locate(spec)?;
                Ok(Column {
                    spec: *spec,
                    leaf,
                    stored,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let groups = row_groups.unwrap_or_else(|| (0..self.metadata().num_row_groups()).collect());
        Ok(ColumnReader {
            source: self,
            columns,
            groups: groups.into_iter(),
            batch_rows: batch_rows.max(1),
            group: None,
            levels: Vec::new(),
            failed: false,
        })
    }
}

/// Checks what the parquet crate takes on trust from a footer, and asserts on rather than
/// fails when it is wrong: every row group's row count is not negative, and every column
/// chunk's bytes lie inside the file (`file_bytes` long). The problem, naming the row group
/// and column, else `Ok`.
fn check_footer(metadata: &ParquetMetaData, file_bytes: u64) -> std::result::Result<(), String> {
    for (g, group) in metadata.row_groups().iter().enumerate() {
        if group.num_rows() < 0 {
            return Err(format!("row group {g}: {} rows", group.num_rows()));
        }
        for chunk in group.columns() {
            let data = chunk.data_page_offset();
            let start = chunk.dictionary_page_offset().unwrap_or(data);
            let len = chunk.compressed_size();
            let inside = data >= 0
                && start >= 0
                && len >= 0
                && (start as u64)
                    .checked_add(len as u64)
                    .is_some_and(|end| end <= file_bytes);
            if !inside {
                return Err(format!(
                    "row group {g}, column `{}`: {len} bytes at byte {start} (data at {data}), \
                     outside the file's {file_bytes} bytes",
                    chunk.column_path().string()
                ));
            }
        }
    }
    Ok(())
}

/// Runs a step of the parquet reader on `path`, turning a panic of the decoder (on corrupt
/// data that the footer's checks cannot see) into the error a corrupt file gets. The reader
/// that panicked is dropped with the error, never used again.
fn guarded<T>(path: &Path, step: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(AssertUnwindSafe(step)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(Error::parquet(
            path,
            ParquetError::General(format!("the decoder failed: {message}")),
        ))
    })
}

/// The row index (within the file) at which row group `group` starts.
pub fn row_group_start(metadata: &ParquetMetaData, group: usize) -> u64 {
    metadata.row_groups()[..group]
        .iter()
        .map(|g| g.num_rows().max(0) as u64)
        .sum()
}

/// One column's canonical values.
enum Values {
    Int(Vec<i64>),
    Float(Vec<f64>),
    Bool(Vec<bool>),
}

/// A decoded slice of rows, one canonical column per requested column.
pub struct Columns {
    /// Row index (within the file) of the first row here.
    pub first_row: u64,
    /// The number of rows.
    pub len: usize,
    values: Vec<Values>,
}

impl Columns {
    /// Column `i` (in request order), requested as [`Kind::Int`].
    pub fn int(&self, i: usize) -> &[i64] {
        match &self.values[i] {
            Values::Int(values) => values,
            _ => panic!("column {i} was not requested as Kind::Int"),
        }
    }

    /// Column `i` (in request order), requested as [`Kind::Float`].
    pub fn float(&self, i: usize) -> &[f64] {
        match &self.values[i] {
            Values::Float(values) => values,
            _ => panic!("column {i} was not requested as Kind::Float"),
        }
    }

    /// Column `i` (in request order), requested as [`Kind::Bool`].
    pub fn bool(&self, i: usize) -> &[bool] {
        match &self.values[i] {
            Values::Bool(values) => values,
            _ => panic!("column {i} was not requested as Kind::Bool"),
        }
    }
}

/// A requested column, located in the file.
struct Column {
    spec: ColumnSpec,
    leaf: usize,
    stored: Stored,
}

/// The row group being read: a reader per requested column, and where it stands.
struct GroupCursor {
    index: usize,
    readers: Vec<ChunkReader>,
    /// The group's rows in the file, by the footer: `start_row..end_row`.
    start_row: u64,
    end_row: u64,
    /// The next row to read.
    next_row: u64,
}

/// Yields [`Columns`] in file order; any decode error names the file, and ends the reading.
pub struct ColumnReader {
    source: ParquetSource,
    columns: Vec<Column>,
    groups: std::vec::IntoIter<usize>,
    batch_rows: usize,
    group: Option<GroupCursor>,
    /// Definition levels, reused.
    levels: Vec<i16>,
    failed: bool,
}

impl ColumnReader {
    fn path(&self) -> &Path {
        &self.source.path
    }

    /// The readers of row group `index`'s requested columns.
    fn open_group(&self, index: usize) -> Result<GroupCursor> {
        let metadata = self.source.metadata();
        let rows = metadata
            .row_groups()
            .get(index)
            .ok_or_else(|| {
                Error::parquet(
                    self.path(),
                    ParquetError::General(format!(
                        "row group {index} asked for, of {}",
                        metadata.num_row_groups()
                    )),
                )
            })?
            .num_rows();
        let group = self
            .source
            .file
            .get_row_group(index)
            .map_err(|e| Error::parquet(self.path(), e))?;
        let readers = self
            .columns
            .iter()
            .map(|c| {
                group
                    .get_column_reader(c.leaf)
                    .map_err(|e| Error::parquet(self.path(), e))
            })
            .collect::<Result<Vec<_>>>()?;
        let start_row = row_group_start(metadata, index);
        Ok(GroupCursor {
            index,
            readers,
            start_row,
            end_row: start_row + rows.max(0) as u64,
            next_row: start_row,
        })
    }

    /// The next `rows` rows of the current row group, every requested column.
    fn read_rows(&mut self, rows: usize) -> Result<Columns> {
        let mut group = self.group.take().expect("a row group being read");
        let mut values = Vec::with_capacity(self.columns.len());
        for (column, reader) in self.columns.iter().zip(&mut group.readers) {
            let read = read_column(reader, column.stored, rows, &mut self.levels)
                .map_err(|e| Error::parquet(&self.source.path, e))?;
            let problem = |row: usize, problem: String| Error::BadValue {
                path: self.source.path.clone(),
                row: group.next_row + row as u64,
                column: column.spec.name,
                problem,
            };
            match read {
                Read::Rows(column_values) => values.push(column_values),
                Read::Short(got) => {
                    return Err(Error::parquet(
                        &self.source.path,
                        ParquetError::General(format!(
                            "column `{}` ends at row {} of the file, inside row group {} \
                             (rows {}..{} by the footer)",
                            column.spec.name,
                            group.next_row + got as u64,
                            group.index,
                            group.start_row,
                            group.end_row
                        )),
                    ))
                }
                Read::Null(row) => return Err(problem(row, "null value".into())),
                Read::Overflow(row, value) => {
                    return Err(problem(
                        row,
                        format!("{value} does not fit a signed 64-bit integer"),
                    ))
                }
            }
        }
        let columns = Columns {
            first_row: group.next_row,
            len: rows,
            values,
        };
        group.next_row += rows as u64;
        self.group = Some(group);
        Ok(columns)
    }

    /// The next batch of rows, or `None` after the last row group.
    fn next_rows(&mut self) -> Result<Option<Columns>> {
        loop {
            match &self.group {
                Some(group) if group.next_row < group.end_row => {
                    let left = group.end_row - group.next_row;
                    let rows = left.min(self.batch_rows as u64) as usize;
                    return self.read_rows(rows).map(Some);
                }
                _ => match self.groups.next() {
                    Some(index) => self.group = Some(self.open_group(index)?),
                    None => return Ok(None),
                },
            }
        }
    }
}

impl Iterator for ColumnReader {
    type Item = Result<Columns>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let path = self.source.path.clone();
        let next = guarded(&path, || self.next_rows());
        if next.is_err() {
            // Reading ends at an error (a reader that panicked may be inconsistent).
            self.failed = true;
        }
        next.transpose()
    }
}

/// What reading a column's next rows gave.
enum Read {
    /// Every row, canonical.
    Rows(Values),
    /// The column chunk ended after this many rows.
    Short(usize),
    /// The row (within the rows read) of the first null.
    Null(usize),
    /// The row (within the rows read) of the first unsigned 64-bit value past `i64::MAX`.
    Overflow(usize, u64),
}

/// The next `rows` rows of a column stored as `stored` (its reader's physical type).
fn read_column(
    reader: &mut ChunkReader,
    stored: Stored,
    rows: usize,
    levels: &mut Vec<i16>,
) -> parquet::errors::Result<Read> {
    let read = match (reader, stored) {
        (ChunkReader::Int32ColumnReader(r), Stored::Int32 { unsigned }) => {
            records(r, rows, levels)?.map(|values| {
                Values::Int(if unsigned {
                    values.iter().map(|&v| i64::from(v as u32)).collect()
                } else {
                    values.iter().map(|&v| i64::from(v)).collect()
                })
            })
        }
        (ChunkReader::Int64ColumnReader(r), Stored::Int64 { unsigned }) => {
            match records(r, rows, levels)? {
                Ok(values) => match values.iter().position(|&v| unsigned && v < 0) {
                    Some(row) => return Ok(Read::Overflow(row, values[row] as u64)),
                    None => Ok(Values::Int(values)),
                },
                Err(read) => Err(read),
            }
        }
        (ChunkReader::FloatColumnReader(r), Stored::Float) => records(r, rows, levels)?
            .map(|values| Values::Float(values.iter().map(|&v| f64::from(v)).collect())),
        (ChunkReader::DoubleColumnReader(r), Stored::Double) => {
            records(r, rows, levels)?.map(Values::Float)
        }
        (ChunkReader::FixedLenByteArrayColumnReader(r), Stored::Half) => records(r, rows, levels)?
            .map(|values| Values::Float(values.iter().map(|v| half_to_f64(v.data())).collect())),
        (ChunkReader::BoolColumnReader(r), Stored::Bool) => {
            records(r, rows, levels)?.map(Values::Bool)
        }
        (_, stored) => {
            return Err(ParquetError::General(format!(
                "a column reader of another physical type than {stored:?}"
            )))
        }
    };
    Ok(read.map_or_else(|why| why, Read::Rows))
}

/// The value of an IEEE 754 half-precision float's two little-endian bytes (NaN for a value
/// of another length, which the footer's type length rules out).
fn half_to_f64(bytes: &[u8]) -> f64 {
    <[u8; 2]>::try_from(bytes).map_or(f64::NAN, |bytes| half::f16::from_le_bytes(bytes).to_f64())
}

/// The next `rows` values of a column: all of them, else why not (`Short` or `Null`).
fn records<T: DataType>(
    reader: &mut ColumnReaderImpl<T>,
    rows: usize,
    levels: &mut Vec<i16>,
) -> parquet::errors::Result<std::result::Result<Vec<T::T>, Read>> {
    let mut values = Vec::with_capacity(rows);
    levels.clear();
    let (records, read, _) = reader.read_records(rows, Some(levels), None, &mut values)?;
    if records < rows {
        return Ok(Err(Read::Short(records)));
    }
    if read < records {
        let row = levels.iter().position(|&l| l == 0).unwrap_or(read);
        return Ok(Err(Read::Null(row)));
    }
    Ok(Ok(values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{write_parquet, Codec, Column, Table, Values};

    fn spec(name: &'static str, kind: Kind) -> ColumnSpec {
        ColumnSpec { name, kind }
    }

    /// Every stored type a kind accepts reads as its canonical value, batch by batch across
    /// row groups, with each batch's first row.
    #[test]
    fn every_accepted_type_reads_as_its_canonical_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let table = Table::new(vec![
            Column::new("i16", Values::Int16(vec![-5, 0, i16::MAX, i16::MIN, 7])),
            Column::new("i32", Values::Int32(vec![-1, 1, i32::MAX, i32::MIN, 0])),
            Column::new(
                "u32",
                Values::UInt32(vec![3_000_000_000, 0, u32::MAX, 1, 2]),
            ),
            Column::new("i64", Values::Int64(vec![i64::MIN, -1, 0, 1, i64::MAX])),
            Column::new("u64", Values::UInt64(vec![0, 1, i64::MAX as u64, 3, 4])),
            Column::new(
                "f32",
                Values::Float32(vec![0.25, -1.5, f32::MAX, 1e-3, 0.0]),
            ),
            Column::new(
                "f64",
                Values::Float64(vec![0.1, -2.0, f64::MAX, 1e-300, 0.0]),
            ),
            // 0.25, -1.5, 65504 (the largest), 2^-24 (the smallest subnormal), -inf.
            Column::new(
                "f16",
                Values::Float16(vec![0x3400, 0xbe00, 0x7bff, 0x0001, 0xfc00]),
            ),
            Column::new("bool", Values::Bool(vec![true, false, false, true, true])),
        ]);
        write_parquet(&path, &table, Codec::Snappy, Some(3)).unwrap();
        let specs = [
            spec("i16", Kind::Int),
            spec("i32", Kind::Int),
            spec("u32", Kind::Int),
            spec("i64", Kind::Int),
            spec("u64", Kind::Int),
            spec("f32", Kind::Float),
            spec("f64", Kind::Float),
            spec("bool", Kind::Bool),
            spec("f16", Kind::Float),
        ];
        let source = ParquetSource::open(&path).unwrap();
        assert_eq!(source.num_rows(), 5);
        let batches: Vec<Columns> = source
            .read(&specs, None, 2)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        // Row groups of 3 and 2 rows, batches of at most 2 rows within each.
        let shape: Vec<(u64, usize)> = batches.iter().map(|c| (c.first_row, c.len)).collect();
        assert_eq!(shape, [(0, 2), (2, 1), (3, 2)]);
        let ints =
            |i: usize| -> Vec<i64> { batches.iter().flat_map(|c| c.int(i).to_vec()).collect() };
        let floats =
            |i: usize| -> Vec<f64> { batches.iter().flat_map(|c| c.float(i).to_vec()).collect() };
        assert_eq!(ints(0), [-5, 0, 32767, -32768, 7]);
        assert_eq!(
            ints(1),
            [-1, 1, i64::from(i32::MAX), i64::from(i32::MIN), 0]
        );
        assert_eq!(ints(2), [3_000_000_000, 0, i64::from(u32::MAX), 1, 2]);
        assert_eq!(ints(3), [i64::MIN, -1, 0, 1, i64::MAX]);
        assert_eq!(ints(4), [0, 1, i64::MAX, 3, 4]);
        let f32s = [0.25f32, -1.5, f32::MAX, 1e-3, 0.0].map(f64::from);
        assert_eq!(floats(5), f32s);
        assert_eq!(floats(6), [0.1, -2.0, f64::MAX, 1e-300, 0.0]);
        let bools: Vec<bool> = batches.iter().flat_map(|c| c.bool(7).to_vec()).collect();
        assert_eq!(bools, [true, false, false, true, true]);
        let halves = [0.25, -1.5, 65504.0, 2f64.powi(-24), f64::NEG_INFINITY];
        assert_eq!(floats(8), halves);

        // Only the chosen row groups, each batch with its own first row.
        let source = ParquetSource::open(&path).unwrap();
        let second: Vec<(u64, Vec<i64>)> = source
            .read(&specs[..1], Some(vec![1]), 10)
            .unwrap()
            .map(|c| c.map(|c| (c.first_row, c.int(0).to_vec())).unwrap())
            .collect();
        assert_eq!(second, [(3, vec![-32768, 7])]);
    }

    /// A column of another kind, or a missing one, fails before any row is read, naming
    /// the column and the type found.
    #[test]
    fn a_mistyped_or_missing_column_names_what_it_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let table = Table::new(vec![
            Column::new("text", Values::Text(vec!["a".into()])),
            Column::new("u32", Values::UInt32(vec![1])),
            Column::new("f32", Values::Float32(vec![1.0])),
            Column::new("bool", Values::Bool(vec![true])),
        ]);
        write_parquet(&path, &table, Codec::Uncompressed, None).unwrap();
        let error = |name, kind| {
            let source = ParquetSource::open(&path).unwrap();
            match source.read(&[spec(name, kind)], None, 10) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("{name} read as {kind:?}"),
            }
        };
        let at = path.display();
        assert_eq!(
            error("text", Kind::Int),
            format!("{at}: column `text` has type BYTE_ARRAY (String), expected an integer type")
        );
        assert_eq!(
            error("u32", Kind::Float),
            format!(
                "{at}: column `u32` has type INT32 (Integer(IntType {{ bit_width: 32, \
                 is_signed: false }})), expected a floating-point type"
            )
        );
        assert_eq!(
            error("f32", Kind::Bool),
            format!("{at}: column `f32` has type FLOAT, expected boolean")
        );
        assert_eq!(
            error("bool", Kind::Int),
            format!("{at}: column `bool` has type BOOLEAN, expected an integer type")
        );
        assert_eq!(
            error("absent", Kind::Int),
            format!("{at}: missing column `absent`")
        );
    }

    /// The first null of a batch is reported with its row in the file.
    #[test]
    fn a_null_names_its_row_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let column = Column::new("x", Values::Float64((0..50).map(f64::from).collect()));
        let table = Table::new(vec![column.with_nulls(&[31, 40])]);
        write_parquet(&path, &table, Codec::Snappy, Some(20)).unwrap();
        let source = ParquetSource::open(&path).unwrap();
        let read: Vec<Result<Columns>> = source
            .read(&[spec("x", Kind::Float)], None, 8)
            .unwrap()
            .collect();
        // Rows 0..20 in 3 batches, 20..28 and then the batch holding row 31, which fails
        // and ends the reading.
        assert_eq!(read.len(), 5);
        assert!(read[..4].iter().all(|c| c.is_ok()));
        let error = read[4].as_ref().err().unwrap();
        assert!(
            matches!(
                error,
                Error::BadValue {
                    row: 31,
                    column: "x",
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn a_decoder_panic_is_the_error_of_a_corrupt_file() {
        let path = Path::new("data/batch_7.parquet");
        let error = guarded::<()>(path, || panic!("offset out of range")).unwrap_err();
        assert!(matches!(&error, Error::Parquet { path: p, .. } if p == path));
        assert_eq!(
            error.to_string(),
            "data/batch_7.parquet: not a readable Parquet file: Parquet error: the decoder \
             failed: offset out of range"
        );
        let error = guarded::<()>(path, || std::panic::panic_any(3)).unwrap_err();
        assert!(error
            .to_string()
            .ends_with("the decoder failed: no message"));
        assert_eq!(guarded(path, || Ok(5)).unwrap(), 5);
    }
}
