//! Reading named Parquet columns as canonical Arrow arrays, whatever the writer chose.
//!
//! Integers of any width (signed or unsigned, dictionary-encoded or not) come out as
//! `Int64`, floats of any width as `Float64`, booleans as `Boolean`. Nullable columns are
//! accepted as long as they hold no null; the first null is reported with its row.
//!
//! A corrupt file is an error naming it, never a panic: the parquet crate asserts on some
//! footers (a column chunk at a negative offset) rather than failing, so the footer's byte
//! ranges are checked before any column is read (`check_footer`), and a panic the decoder
//! still raises on corrupt data becomes the same error (`guarded`).

use std::fs::File;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Schema};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;

use crate::error::{Error, IoContext, Result};

/// The canonical kind a column is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Any integer type, read as `Int64`.
    Int,
    /// Any floating-point type, read as `Float64`.
    Float,
    /// Boolean.
    Bool,
}

impl Kind {
    fn accepts(self, t: &DataType) -> bool {
        match t {
            DataType::Dictionary(_, value) => self.accepts(value),
            _ => match self {
                Kind::Int => t.is_integer(),
                Kind::Float => t.is_floating(),
                Kind::Bool => *t == DataType::Boolean,
            },
        }
    }

    fn target(self) -> DataType {
        match self {
            Kind::Int => DataType::Int64,
            Kind::Float => DataType::Float64,
            Kind::Bool => DataType::Boolean,
        }
    }

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

/// An open Parquet file: its footer, read once.
pub struct ParquetSource {
    path: PathBuf,
    builder: ParquetRecordBatchReaderBuilder<File>,
}

impl ParquetSource {
    /// Opens `path` and decodes its footer.
    pub fn open(path: &Path) -> Result<ParquetSource> {
        let file = File::open(path).at(path)?;
        let file_bytes = file.metadata().at(path)?.len();
        let builder = guarded(path, || {
            ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| Error::parquet(path, e))
        })?;
        check_footer(builder.metadata(), file_bytes)
            .map_err(|problem| Error::parquet(path, ParquetError::General(problem)))?;
        Ok(ParquetSource {
            path: path.to_path_buf(),
            builder,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The decoded footer.
    pub fn metadata(&self) -> &Arc<ParquetMetaData> {
        self.builder.metadata()
    }

    /// The number of rows in the file.
    pub fn num_rows(&self) -> u64 {
        self.metadata().file_metadata().num_rows().max(0) as u64
    }

    /// The Arrow schema of the file.
    pub fn schema(&self) -> &Schema {
        self.builder.schema()
    }

    /// Whether the file has a column named `name`.
    pub fn has_column(&self, name: &str) -> bool {
        self.schema().field_with_name(name).is_ok()
    }

    /// Reads `columns` (in that order) from the chosen row groups (all when `None`),
    /// `batch_rows` rows at a time. Fails at once on a missing or mistyped column.
    pub fn read(
        self,
        columns: &[ColumnSpec],
        row_groups: Option<Vec<usize>>,
        batch_rows: usize,
    ) -> Result<ColumnReader> {
        let schema = self.schema();
        for spec in columns {
            let field = schema
                .field_with_name(spec.name)
                .map_err(|_| Error::MissingColumn {
                    path: self.path.clone(),
                    column: spec.name,
                })?;
            if !spec.kind.accepts(field.data_type()) {
                return Err(Error::ColumnType {
                    path: self.path.clone(),
                    column: spec.name,
                    found: field.data_type().to_string(),
                    expected: spec.kind.describe(),
                });
            }
        }
        let mask = ProjectionMask::columns(
            self.builder.parquet_schema(),
            columns.iter().map(|c| c.name),
        );
        let first_row = match &row_groups {
            Some(groups) => groups
                .first()
                .map_or(0, |&g| row_group_start(self.metadata(), g)),
            None => 0,
        };
        let mut builder = self
            .builder
            .with_projection(mask)
            .with_batch_size(batch_rows.max(1));
        if let Some(groups) = row_groups {
            builder = builder.with_row_groups(groups);
        }
        let inner = guarded(&self.path, || {
            builder.build().map_err(|e| Error::parquet(&self.path, e))
        })?;
        Ok(ColumnReader {
            path: self.path,
            specs: columns.to_vec(),
            inner: Some(inner),
            next_row: first_row,
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

/// A decoded slice of rows, one canonical array per requested column.
pub struct Columns {
    /// Row index (within the file) of the first row here.
    pub first_row: u64,
    /// The number of rows.
    pub len: usize,
    arrays: Vec<ArrayRef>,
}

impl Columns {
    /// Column `i` (in request order) as `Int64`.
    pub fn int(&self, i: usize) -> &[i64] {
        self.arrays[i]
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("read as Int64")
            .values()
    }

    /// Column `i` (in request order) as `Float64`.
    pub fn float(&self, i: usize) -> &[f64] {
        self.arrays[i]
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("read as Float64")
            .values()
    }

    /// Column `i` (in request order) as `Boolean`.
    pub fn bool(&self, i: usize) -> &BooleanArray {
        self.arrays[i]
            .as_any()
            .downcast_ref::<BooleanArray>()
            .expect("read as Boolean")
    }
}

/// Yields [`Columns`] in file order; any decode error names the file.
pub struct ColumnReader {
    path: PathBuf,
    specs: Vec<ColumnSpec>,
    /// `None` after an error.
    inner: Option<ParquetRecordBatchReader>,
    next_row: u64,
}

impl ColumnReader {
    fn canonical(&self, batch: &RecordBatch) -> Result<Columns> {
        let first_row = self.next_row;
        let mut arrays = Vec::with_capacity(self.specs.len());
        for spec in &self.specs {
            let raw = batch
                .column_by_name(spec.name)
                .expect("projected column present");
            if raw.null_count() > 0 {
                let row = (0..raw.len()).find(|&i| raw.is_null(i)).unwrap_or(0);
                return Err(Error::BadValue {
                    path: self.path.clone(),
                    row: first_row + row as u64,
                    column: spec.name,
                    problem: "null value".into(),
                });
            }
            let target = spec.kind.target();
            let array = if raw.data_type() == &target {
                raw.clone()
            } else {
                arrow_cast::cast(raw, &target).map_err(|e| {
                    Error::parquet(&self.path, ParquetError::ArrowError(e.to_string()))
                })?
            };
            arrays.push(array);
        }
        Ok(Columns {
            first_row,
            len: batch.num_rows(),
            arrays,
        })
    }
}

impl Iterator for ColumnReader {
    type Item = Result<Columns>;

    fn next(&mut self) -> Option<Self::Item> {
        let inner = self.inner.as_mut()?;
        let path = &self.path;
        let next = guarded(path, || {
            inner
                .next()
                .transpose()
                .map_err(|e| Error::parquet(path, ParquetError::ArrowError(e.to_string())))
        });
        let batch = match next {
            Ok(batch) => batch?,
            Err(e) => {
                // Reading ends at an error (a reader that panicked may be inconsistent).
                self.inner = None;
                return Some(Err(e));
            }
        };
        let columns = self.canonical(&batch);
        self.next_row += batch.num_rows() as u64;
        Some(columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
