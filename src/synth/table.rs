//! Tables of named columns written as Parquet files, through the parquet crate's own column
//! writers: the generated datasets, and the variants real writers produce (other integer
//! widths, unsigned or float32 columns, nulls, text, plain pages, row groups and codecs) that
//! the tests feed the reader.
//!
//! Every column is written `OPTIONAL`, as pandas and pyarrow write them; `Int16` as INT32
//! annotated as a signed 16-bit integer (the Kaggle files' `sensor_id`), the unsigned kinds as
//! INT32 or INT64 annotated unsigned, `Float16` as FIXED_LEN_BYTE_ARRAY(2) annotated Float16,
//! `Text` as UTF-8 BYTE_ARRAY.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::{
    BrotliLevel, Compression, GzipLevel, LogicalType, Repetition, Type as Physical, ZstdLevel,
};
use parquet::data_type::{
    BoolType, ByteArray, ByteArrayType, DataType, DoubleType, FixedLenByteArray,
    FixedLenByteArrayType, FloatType, Int32Type, Int64Type,
};
use parquet::file::properties::{WriterProperties, WriterPropertiesBuilder};
use parquet::file::writer::{SerializedColumnWriter, SerializedFileWriter};
use parquet::schema::types::{Type, TypePtr};

use super::Codec;
use crate::error::{Error, IoContext, Result};

/// Rows a column is written in at a time: 8 MiB of 8-byte values collected for a write,
/// not a whole batch file's. A multiple of the parquet crate's write batch (1,024 rows), so
/// the pages come out as one write of the whole column makes them (`spill`'s tests show it,
/// and that a chunk of 1,000 rows does not).
pub(super) const WRITE_CHUNK_ROWS: usize = 1 << 20;

/// A column's values, typed as they are written.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// INT32 annotated as a signed 16-bit integer.
    Int16(Vec<i16>),
    /// INT32.
    Int32(Vec<i32>),
    /// INT32 annotated as an unsigned 32-bit integer.
    UInt32(Vec<u32>),
    /// INT64.
    Int64(Vec<i64>),
    /// INT64 annotated as an unsigned 64-bit integer.
    UInt64(Vec<u64>),
    /// FLOAT.
    Float32(Vec<f32>),
    /// DOUBLE.
    Float64(Vec<f64>),
    /// FIXED_LEN_BYTE_ARRAY(2) annotated Float16: each value's IEEE 754 half-precision bits.
    Float16(Vec<u16>),
    /// BOOLEAN.
    Bool(Vec<bool>),
    /// BYTE_ARRAY annotated as a UTF-8 string.
    Text(Vec<String>),
}

impl Values {
    /// The number of values (rows, nulls included).
    pub fn len(&self) -> usize {
        match self {
            Values::Int16(v) => v.len(),
            Values::Int32(v) => v.len(),
            Values::UInt32(v) => v.len(),
            Values::Int64(v) => v.len(),
            Values::UInt64(v) => v.len(),
            Values::Float32(v) => v.len(),
            Values::Float64(v) => v.len(),
            Values::Float16(v) => v.len(),
            Values::Bool(v) => v.len(),
            Values::Text(v) => v.len(),
        }
    }

    /// Whether there is no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The Parquet type a column of these values is written as.
    fn parquet_type(&self) -> (Physical, Option<LogicalType>) {
        match self {
            Values::Int16(_) => (Physical::INT32, Some(LogicalType::integer(16, true))),
            Values::Int32(_) => (Physical::INT32, None),
            Values::UInt32(_) => (Physical::INT32, Some(LogicalType::integer(32, false))),
            Values::Int64(_) => (Physical::INT64, None),
            Values::UInt64(_) => (Physical::INT64, Some(LogicalType::integer(64, false))),
            Values::Float32(_) => (Physical::FLOAT, None),
            Values::Float64(_) => (Physical::DOUBLE, None),
            Values::Float16(_) => (Physical::FIXED_LEN_BYTE_ARRAY, Some(LogicalType::Float16)),
            Values::Bool(_) => (Physical::BOOLEAN, None),
            Values::Text(_) => (Physical::BYTE_ARRAY, Some(LogicalType::String)),
        }
    }
}

/// A named column; the rows in `nulls` are written as nulls (their values are not written).
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The column's name.
    pub name: String,
    /// One value per row.
    pub values: Values,
    /// Rows written as null, ascending.
    pub nulls: Vec<usize>,
}

impl Column {
    /// A column of `values` with no null.
    pub fn new(name: &str, values: Values) -> Column {
        Column {
            name: name.into(),
            values,
            nulls: Vec::new(),
        }
    }

    /// The same column with rows `rows` null.
    pub fn with_nulls(mut self, rows: &[usize]) -> Column {
        self.nulls = rows.to_vec();
        self.nulls.sort_unstable();
        self.nulls.dedup();
        self
    }

    fn is_null(&self, row: usize) -> bool {
        !self.nulls.is_empty() && self.nulls.binary_search(&row).is_ok()
    }

    /// The column's field in a Parquet schema.
    fn field(&self) -> Result<TypePtr> {
        let (physical, logical) = self.values.parquet_type();
        let length = if matches!(self.values, Values::Float16(_)) {
            2
        } else {
            -1
        };
        Type::primitive_type_builder(&self.name, physical)
            .with_repetition(Repetition::OPTIONAL)
            .with_logical_type(logical)
            .with_length(length)
            .build()
            .map(Arc::new)
            .map_err(|e| Error::config("table", format!("column `{}`: {e}", self.name)))
    }

    /// Writes rows `rows` into the column's chunk of a row group, [`WRITE_CHUNK_ROWS`] at a
    /// time (the pages are those of one write of them all).
    pub(super) fn write(
        &self,
        writer: &mut SerializedColumnWriter,
        rows: Range<usize>,
    ) -> parquet::errors::Result<()> {
        for start in rows.clone().step_by(WRITE_CHUNK_ROWS) {
            self.write_chunk(writer, start..rows.end.min(start + WRITE_CHUNK_ROWS))?;
        }
        Ok(())
    }

    /// Writes rows `rows` in one write: their levels and values are collected first.
    fn write_chunk(
        &self,
        writer: &mut SerializedColumnWriter,
        rows: Range<usize>,
    ) -> parquet::errors::Result<()> {
        let levels: Vec<i16> = rows.clone().map(|r| i16::from(!self.is_null(r))).collect();
        let kept = rows.filter(|&r| !self.is_null(r));
        match &self.values {
            Values::Int16(v) => put::<Int32Type>(writer, kept.map(|r| i32::from(v[r])), &levels),
            Values::Int32(v) => put::<Int32Type>(writer, kept.map(|r| v[r]), &levels),
            Values::UInt32(v) => put::<Int32Type>(writer, kept.map(|r| v[r] as i32), &levels),
            Values::Int64(v) => put::<Int64Type>(writer, kept.map(|r| v[r]), &levels),
            Values::UInt64(v) => put::<Int64Type>(writer, kept.map(|r| v[r] as i64), &levels),
            Values::Float32(v) => put::<FloatType>(writer, kept.map(|r| v[r]), &levels),
            Values::Float64(v) => put::<DoubleType>(writer, kept.map(|r| v[r]), &levels),
            Values::Float16(v) => put::<FixedLenByteArrayType>(
                writer,
                kept.map(|r| FixedLenByteArray::from(v[r].to_le_bytes().to_vec())),
                &levels,
            ),
            Values::Bool(v) => put::<BoolType>(writer, kept.map(|r| v[r]), &levels),
            Values::Text(v) => put::<ByteArrayType>(
                writer,
                kept.map(|r| ByteArray::from(v[r].as_str())),
                &levels,
            ),
        }
    }
}

/// Writes `values` (the non-null ones) and `levels` (every row's) through `writer`.
fn put<T: DataType>(
    writer: &mut SerializedColumnWriter,
    values: impl Iterator<Item = T::T>,
    levels: &[i16],
) -> parquet::errors::Result<()> {
    let values: Vec<T::T> = values.collect();
    writer
        .typed::<T>()
        .write_batch(&values, Some(levels), None)
        .map(|_| ())
}

/// Columns of equal length, in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// The columns.
    pub columns: Vec<Column>,
}

impl Table {
    /// A table of these columns.
    pub fn new(columns: Vec<Column>) -> Table {
        Table { columns }
    }

    /// The number of rows (the first column's length; 0 without columns).
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.values.len())
    }

    /// The table with `column` in place of the column of its name (appended when there is
    /// none).
    pub fn with_column(mut self, column: Column) -> Table {
        match self.columns.iter_mut().find(|c| c.name == column.name) {
            Some(place) => *place = column,
            None => self.columns.push(column),
        }
        self
    }

    /// The table without its column named `name`.
    pub fn without(mut self, name: &str) -> Table {
        self.columns.retain(|c| c.name != name);
        self
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The table's Parquet schema.
    pub fn schema(&self) -> Result<TypePtr> {
        let fields = self
            .columns
            .iter()
            .map(Column::field)
            .collect::<Result<Vec<_>>>()?;
        Type::group_type_builder("schema")
            .with_fields(fields)
            .build()
            .map(Arc::new)
            .map_err(|e| Error::config("table", e.to_string()))
    }
}

/// The writer properties of generated files: `codec`, and the parquet crate's defaults
/// otherwise (dictionary pages, page statistics).
pub fn writer_properties(codec: Codec) -> WriterPropertiesBuilder {
    let compression = match codec {
        Codec::Snappy => Compression::SNAPPY,
        Codec::Zstd => Compression::ZSTD(ZstdLevel::default()),
        Codec::Gzip => Compression::GZIP(GzipLevel::default()),
        Codec::Lz4 => Compression::LZ4,
        Codec::Lz4Raw => Compression::LZ4_RAW,
        Codec::Brotli => Compression::BROTLI(BrotliLevel::default()),
        Codec::Uncompressed => Compression::UNCOMPRESSED,
    };
    WriterProperties::builder().set_compression(compression)
}

/// Writes `table` as a Parquet file compressed with `codec`, in row groups of
/// `row_group_rows` rows (one row group when `None`).
pub fn write_parquet(
    path: &Path,
    table: &Table,
    codec: Codec,
    row_group_rows: Option<usize>,
) -> Result<()> {
    write_parquet_with(
        path,
        table,
        writer_properties(codec).build(),
        row_group_rows,
    )
}

/// Writes `table` as a Parquet file with `properties`, in row groups of `row_group_rows`
/// rows (one row group when `None`; none for a table without rows).
pub fn write_parquet_with(
    path: &Path,
    table: &Table,
    properties: WriterProperties,
    row_group_rows: Option<usize>,
) -> Result<()> {
    let rows = table.rows();
    if let Some(c) = table.columns.iter().find(|c| c.values.len() != rows) {
        return Err(Error::config(
            "table",
            format!(
                "column `{}` has {} rows, the first {rows}",
                c.name,
                c.values.len()
            ),
        ));
    }
    let layout = FileLayout {
        schema: table.schema()?,
        columns: table.columns.len(),
        rows,
        row_group_rows,
    };
    write_row_groups(path, &layout, properties, |index, range, chunk| {
        table.columns[index]
            .write(chunk, range)
            .map_err(|e| Error::parquet_write(path, e))
    })
}

/// The shape of a Parquet file [`write_row_groups`] writes.
pub(super) struct FileLayout {
    /// The columns' schema.
    pub schema: TypePtr,
    /// The number of columns (the schema's fields).
    pub columns: usize,
    /// The number of rows.
    pub rows: usize,
    /// Rows per row group (one row group when `None`; none without rows).
    pub row_group_rows: Option<usize>,
}

/// Writes a Parquet file of `layout` with `properties`, each row group's column chunks in
/// schema order, their rows given by `write_rows(column, rows, chunk)`: one call, or several
/// of consecutive ranges, per chunk.
pub(super) fn write_row_groups(
    path: &Path,
    layout: &FileLayout,
    properties: WriterProperties,
    mut write_rows: impl FnMut(usize, Range<usize>, &mut SerializedColumnWriter) -> Result<()>,
) -> Result<()> {
    let failed = |problem: String| {
        Error::parquet_write(path, parquet::errors::ParquetError::General(problem))
    };
    let file = File::create(path).at(path)?;
    let mut writer = SerializedFileWriter::new(file, layout.schema.clone(), Arc::new(properties))
        .map_err(|e| Error::parquet_write(path, e))?;
    let step = layout.row_group_rows.unwrap_or(usize::MAX).max(1);
    for start in (0..layout.rows).step_by(step) {
        let range = start..layout.rows.min(start.saturating_add(step));
        let mut group = writer
            .next_row_group()
            .map_err(|e| Error::parquet_write(path, e))?;
        for index in 0..layout.columns {
            let mut chunk = group
                .next_column()
                .map_err(|e| Error::parquet_write(path, e))?
                .ok_or_else(|| {
                    let name = layout.schema.get_fields()[index].name();
                    failed(format!("no writer for column `{name}`"))
                })?;
            write_rows(index, range.clone(), &mut chunk)?;
            chunk.close().map_err(|e| Error::parquet_write(path, e))?;
        }
        group.close().map_err(|e| Error::parquet_write(path, e))?;
    }
    writer.close().map_err(|e| Error::parquet_write(path, e))?;
    Ok(())
}
