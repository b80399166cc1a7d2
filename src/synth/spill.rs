//! A table too long to hold, written as one Parquet file: its rows appended a batch at a
//! time to files of raw column values (8 bytes a value, one file a column), then read back
//! a chunk at a time into the Parquet file's column chunks. The split's single meta file
//! (132M rows for the Kaggle training set) is written this way, in the memory of one chunk.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use parquet::file::writer::SerializedColumnWriter;

use super::table::{write_row_groups, FileLayout, WRITE_CHUNK_ROWS};
use super::{writer_properties, Codec, Column, Table, Values};
use crate::error::{Error, IoContext, Result};

/// Rows read back at a time: those a column is written in at a time.
pub(super) const CHUNK_ROWS: usize = WRITE_CHUNK_ROWS;

/// Which of the 8-byte kinds a spilled column holds.
#[derive(Clone, Copy)]
enum Kind {
    Int64,
    Float64,
}

/// One spilled column: its name, kind and file.
struct SpilledColumn {
    name: String,
    kind: Kind,
    path: PathBuf,
    file: BufWriter<File>,
}

/// The rows of a table appended so far, on disk (see the module's text).
pub(super) struct TableSpill {
    dir: PathBuf,
    schema: Table,
    columns: Vec<SpilledColumn>,
    rows: usize,
    chunk_rows: usize,
}

impl TableSpill {
    /// A spill in the new directory `dir` for tables of `schema`'s columns (its values are
    /// not used; each must be `Int64` or `Float64`).
    pub(super) fn create(dir: &Path, schema: Table, chunk_rows: usize) -> Result<TableSpill> {
        std::fs::create_dir(dir).at(dir)?;
        let columns = schema
            .columns
            .iter()
            .enumerate()
            .map(|(index, column)| {
                let kind = match column.values {
                    Values::Int64(_) => Kind::Int64,
                    Values::Float64(_) => Kind::Float64,
                    _ => {
                        let problem = format!("column `{}` is not 8-byte", column.name);
                        return Err(Error::config("spill", problem));
                    }
                };
                let path = dir.join(format!("{index}.bin"));
                let file = File::create(&path).at(&path)?;
                Ok(SpilledColumn {
                    name: column.name.clone(),
                    kind,
                    path,
                    file: BufWriter::new(file),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(TableSpill {
            dir: dir.to_path_buf(),
            schema,
            columns,
            rows: 0,
            chunk_rows: chunk_rows.max(1),
        })
    }

    /// Appends `table`'s rows; a table whose columns are not the schema's (names, order,
    /// kinds, equal lengths) is refused before anything is written.
    pub(super) fn append(&mut self, table: &Table) -> Result<()> {
        let rows = table.rows();
        let encoded: Option<Vec<Vec<u8>>> = (table.columns.len() == self.columns.len())
            .then(|| {
                self.columns
                    .iter()
                    .zip(&table.columns)
                    .map(|(spilled, column)| {
                        let bytes = match (&column.values, spilled.kind) {
                            (Values::Int64(v), Kind::Int64) => {
                                v.iter().flat_map(|x| x.to_le_bytes()).collect()
                            }
                            (Values::Float64(v), Kind::Float64) => {
                                v.iter().flat_map(|x| x.to_le_bytes()).collect()
                            }
                            _ => return None,
                        };
                        let fits = column.name == spilled.name && column.values.len() == rows;
                        fits.then_some(bytes)
                    })
                    .collect()
            })
            .flatten();
        let Some(encoded) = encoded else {
            let given: Vec<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
            let spilled: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
            let problem = format!("columns {given:?} do not fit the spill of {spilled:?}");
            return Err(Error::config("spill", problem));
        };
        for (spilled, bytes) in self.columns.iter_mut().zip(encoded) {
            spilled.file.write_all(&bytes).at(&spilled.path)?;
        }
        self.rows += rows;
        Ok(())
    }

    /// Writes every row appended as the Parquet file `path` (`codec`, in row groups of
    /// `row_group_rows` rows, one when `None`): the same bytes as [`super::write_parquet`]
    /// of the whole table in memory. The spill's directory goes.
    pub(super) fn write_parquet(
        mut self,
        path: &Path,
        codec: Codec,
        row_group_rows: Option<usize>,
    ) -> Result<()> {
        for spilled in &mut self.columns {
            spilled.file.flush().at(&spilled.path)?;
        }
        let layout = FileLayout {
            schema: self.schema.schema()?,
            columns: self.columns.len(),
            rows: self.rows,
            row_group_rows,
        };
        let properties = writer_properties(codec).build();
        write_row_groups(path, &layout, properties, |index, range, chunk| {
            self.write_column(index, range, chunk, path)
        })?;
        drop(self.columns);
        std::fs::remove_dir_all(&self.dir).at(&self.dir)
    }

    /// Reads rows `rows` of column `index` back a chunk at a time into `chunk`, a column
    /// chunk of the file `target`.
    fn write_column(
        &self,
        index: usize,
        rows: Range<usize>,
        chunk: &mut SerializedColumnWriter,
        target: &Path,
    ) -> Result<()> {
        let spilled = &self.columns[index];
        let mut file = File::open(&spilled.path).at(&spilled.path)?;
        file.seek(SeekFrom::Start(rows.start as u64 * 8))
            .at(&spilled.path)?;
        let mut bytes = vec![0u8; self.chunk_rows.min(rows.len()) * 8];
        for start in rows.clone().step_by(self.chunk_rows) {
            let n = self.chunk_rows.min(rows.end - start);
            file.read_exact(&mut bytes[..n * 8]).at(&spilled.path)?;
            let words = bytes[..n * 8]
                .chunks_exact(8)
                .map(|b| <[u8; 8]>::try_from(b).expect("chunks_exact gives 8 bytes"));
            let values = match spilled.kind {
                Kind::Int64 => Values::Int64(words.map(i64::from_le_bytes).collect()),
                Kind::Float64 => Values::Float64(words.map(f64::from_le_bytes).collect()),
            };
            Column::new(&spilled.name, values)
                .write(chunk, 0..n)
                .map_err(|e| Error::parquet_write(target, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{meta_columns, write_parquet, MetaTable};
    use super::*;
    use crate::rng::Rng;

    /// Three batches' meta tables (320,002 rows: pages of 8-byte values hold about 131k, so
    /// the whole table's columns span pages, and `event_id`'s dictionary overflows into
    /// plain pages), and the whole table.
    fn batches(labels: bool) -> (Vec<Table>, Table) {
        let mut rng = Rng::stream(5, 0);
        let mut all = MetaTable {
            labels,
            ..MetaTable::default()
        };
        let mut tables = Vec::new();
        let (mut pulses, mut event_id) = (0i64, 1i64);
        for (batch, events) in [(1i64, 150_000), (2, 1), (3, 170_001)] {
            let mut meta = MetaTable {
                labels,
                ..MetaTable::default()
            };
            for _ in 0..events {
                let length = 1 + (rng.uniform() * 200.0) as i64;
                meta.batch_id.push(batch);
                meta.event_id.push(event_id);
                meta.first_pulse_index.push(pulses);
                meta.last_pulse_index.push(pulses + length - 1);
                pulses += length;
                if labels {
                    meta.azimuth.push(rng.uniform() * std::f64::consts::TAU);
                    meta.zenith.push(rng.uniform() * std::f64::consts::PI);
                }
                event_id += 3;
            }
            all.extend(&meta);
            tables.push(meta_columns(&meta));
        }
        (tables, meta_columns(&all))
    }

    /// Chunks of one write batch and larger than the table, row groups across the batches' boundaries, both codecs'
    /// pages and with and without labels: the spilled file is the in-memory table's, byte for
    /// byte, and the spill's files are gone.
    #[test]
    fn a_spilled_table_is_written_as_the_whole_table_would_be() {
        let dir = tempfile::tempdir().unwrap();
        let mut compared = 0;
        for labels in [true, false] {
            let (tables, whole) = batches(labels);
            assert_eq!(whole.rows(), 320_002);
            for (chunk_rows, row_group_rows, codec) in [
                // 1,000-row chunks are not a multiple of the write batch: their pages
                // close at other rows, and this comparison fails.
                (1024, None, Codec::Snappy),
                (CHUNK_ROWS, None, Codec::Zstd),
                (65_536, Some(100_000), Codec::Uncompressed),
            ] {
                let expected = dir.path().join("expected.parquet");
                write_parquet(&expected, &whole, codec, row_group_rows).unwrap();
                let spill_dir = dir.path().join("spill");
                let mut spill =
                    TableSpill::create(&spill_dir, tables[0].clone(), chunk_rows).unwrap();
                for table in &tables {
                    spill.append(table).unwrap();
                }
                let written = dir.path().join("spilled.parquet");
                spill
                    .write_parquet(&written, codec, row_group_rows)
                    .unwrap();
                let (a, b) = (
                    std::fs::read(&expected).unwrap(),
                    std::fs::read(&written).unwrap(),
                );
                assert!(
                    a == b,
                    "labels {labels}, chunks {chunk_rows}, groups {row_group_rows:?}"
                );
                assert!(!spill_dir.exists());
                compared += 1;
            }
        }
        assert_eq!(compared, 6);
    }

    /// A table of other columns, or of a kind not 8 bytes wide, is refused, naming the column.
    #[test]
    fn a_table_that_does_not_fit_the_spill_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (tables, _) = batches(true);
        let mut spill = TableSpill::create(&dir.path().join("a"), tables[0].clone(), 1024).unwrap();
        let renamed = tables[1].clone().without("zenith");
        let Err(Error::Config { problem, .. }) = spill.append(&renamed) else {
            panic!("a table without zenith was taken");
        };
        assert!(
            problem.ends_with(
                "\"azimuth\"] do not fit the spill of [\"batch_id\", \"event_id\", \
             \"first_pulse_index\", \"last_pulse_index\", \"azimuth\", \"zenith\"]"
            ),
            "{problem}"
        );
        let retyped = tables[1]
            .clone()
            .with_column(Column::new("batch_id", Values::Float64(vec![2.0])));
        let refused = spill.append(&retyped).map_err(|e| e.to_string());
        assert!(refused.is_err_and(|e| e.contains("do not fit the spill")));
        let narrow = Table::new(vec![Column::new("sensor_id", Values::Int16(vec![1]))]);
        let Err(Error::Config { problem, .. }) =
            TableSpill::create(&dir.path().join("b"), narrow, 8)
        else {
            panic!("an int16 column was taken");
        };
        assert_eq!(problem, "column `sensor_id` is not 8-byte");
        // Nothing of the refused table was written: the rows appended after it are all there.
        spill.append(&tables[1]).unwrap();
        let written = dir.path().join("one.parquet");
        spill.write_parquet(&written, Codec::Snappy, None).unwrap();
        let expected = dir.path().join("expected.parquet");
        write_parquet(&expected, &tables[1], Codec::Snappy, None).unwrap();
        assert!(std::fs::read(&written).unwrap() == std::fs::read(&expected).unwrap());
    }
}
