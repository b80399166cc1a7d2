//! Every kind of bad input stops the conversion with an error that names the file and the
//! row, event or field; no manifest is ever written. What real writers produce is accepted.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::*;
use parquet::basic::Encoding;
use parquet::file::metadata::{
    ColumnChunkMetaDataBuilder, ParquetMetaData, ParquetMetaDataReader, ParquetMetaDataWriter,
};
use shardify::dataset::verify::verify;
use shardify::source::layout::InputSet;
use shardify::synth::{
    self, meta_columns, pulse_columns, Codec, Column, MetaTable, PulseTable, Table, Values,
};

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    /// A layout with batches 1 and 2 of generated data, after `edit` changed the tables.
    fn new(
        edit: impl FnOnce(&mut PulseTable, &mut MetaTable, &mut PulseTable, &mut MetaTable),
    ) -> Case {
        let dir = tempfile::tempdir().unwrap();
        let mut next = 0;
        let (mut t1, mut m1) = generated_batch(1, 1, 40, &mut next, true);
        let (mut t2, mut m2) = generated_batch(2, 2, 40, &mut next, true);
        edit(&mut t1, &mut m1, &mut t2, &mut m2);
        Self::write(
            dir,
            vec![(1, pulse_columns(&t1)), (2, pulse_columns(&t2))],
            &[&m1, &m2],
        )
    }

    fn write(dir: tempfile::TempDir, batches: Vec<(i64, Table)>, metas: &[&MetaTable]) -> Case {
        let mut meta = MetaTable {
            labels: true,
            ..MetaTable::default()
        };
        for m in metas {
            meta.extend(m);
        }
        write_layout(&dir.path().join("src"), &batches, &meta_columns(&meta));
        Case { dir }
    }

    fn batch(&self, id: i64) -> String {
        self.dir
            .path()
            .join(format!("src/train/batch_{id}.parquet"))
            .display()
            .to_string()
    }

    fn convert(&self) -> shardify::Result<()> {
        let out = self.dir.path().join("out");
        let result =
            convert_all(&self.dir.path().join("src"), "train", &out, &options(1, 2)).map(|_| ());
        if result.is_err() {
            assert!(
                !out.join("manifest.json").exists(),
                "no manifest after an error"
            );
        }
        result
    }

    fn error(&self) -> String {
        self.convert()
            .expect_err("conversion must fail")
            .to_string()
    }
}

fn assert_contains(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
}

#[test]
fn baseline_converts() {
    Case::new(|_, _, _, _| {}).convert().unwrap();
}

#[test]
fn missing_and_mistyped_columns() {
    let dir = tempfile::tempdir().unwrap();
    let mut next = 0;
    let (t, m) = generated_batch(1, 1, 10, &mut next, true);
    let without_charge = pulse_columns(&t).without("charge");
    let case = Case::write(dir, vec![(1, without_charge)], &[&m]);
    assert_contains(&case.error(), &[&case.batch(1), "missing column `charge`"]);

    // Text where a float is expected, an integer where a float is, a float where an
    // integer is.
    let rows = t.time.len();
    let mistyped = [
        (
            Column::new("charge", Values::Text(vec!["1.0".into(); rows])),
            "column `charge` has type BYTE_ARRAY (String), expected a floating-point type",
        ),
        (
            Column::new("charge", Values::Int64(vec![1; rows])),
            "column `charge` has type INT64, expected a floating-point type",
        ),
        (
            Column::new("time", Values::Float64(vec![6000.0; rows])),
            "column `time` has type DOUBLE, expected an integer type",
        ),
    ];
    for (column, expected) in mistyped {
        let dir = tempfile::tempdir().unwrap();
        let case = Case::write(dir, vec![(1, pulse_columns(&t).with_column(column))], &[&m]);
        assert_contains(&case.error(), &[&case.batch(1), expected]);
    }
}

#[test]
fn null_value_names_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let mut next = 0;
    let (t, m) = generated_batch(1, 1, 10, &mut next, true);
    let times = Column::new("time", Values::Int64(t.time.clone())).with_nulls(&[17]);
    let case = Case::write(dir, vec![(1, pulse_columns(&t).with_column(times))], &[&m]);
    assert_contains(
        &case.error(),
        &[&case.batch(1), "row 17, column `time`: null value"],
    );
}

#[test]
fn non_finite_charge() {
    let mut event = 0;
    let case = Case::new(|t, m, _, _| {
        t.charge[25] = f64::INFINITY;
        event = m.event_id[(0..m.event_id.len())
            .find(|&i| m.last_pulse_index[i] >= 25)
            .unwrap()];
    });
    assert_contains(
        &case.error(),
        &[
            &case.batch(1),
            "row 25, column `charge`",
            &format!("charge inf of event {event} is not finite"),
        ],
    );
}

#[test]
fn meta_out_of_bounds() {
    let case = Case::new(|t, m, _, _| {
        let last = m.event_id.len() - 1;
        m.last_pulse_index[last] = t.time.len() as i64 + 4;
    });
    assert_contains(
        &case.error(),
        &[&case.batch(1), "batch 1", "but the file has"],
    );
}

#[test]
fn meta_event_absent_from_its_batch() {
    let case = Case::new(|t, m, _, _| {
        let n = t.time.len() as i64;
        m.batch_id.push(1);
        m.event_id.push(999_999);
        m.first_pulse_index.push(n);
        m.last_pulse_index.push(n + 9);
        m.azimuth.push(1.0);
        m.zenith.push(1.0);
    });
    assert_contains(
        &case.error(),
        &[&case.batch(1), "event 999999 has rows", "but the file has"],
    );
}

#[test]
fn meta_overlapping_ranges() {
    let case = Case::new(|_, m, _, _| m.first_pulse_index[3] -= 1);
    let e = case.error();
    assert_contains(&e, &[&case.batch(1), "overlaps event"]);
}

#[test]
fn meta_disagreeing_with_rows() {
    let case = Case::new(|t, m, _, _| {
        let r = m.first_pulse_index[5] as usize;
        t.event_id[r] = 424_242;
    });
    assert_contains(&case.error(), &[&case.batch(1), "holds event 424242"]);
}

#[test]
fn rows_not_covered_by_meta() {
    let mut rows = (0, 0);
    let case = Case::new(|_, m, _, _| {
        rows = (m.first_pulse_index[4], m.last_pulse_index[4]);
        for col in [
            &mut m.batch_id,
            &mut m.event_id,
            &mut m.first_pulse_index,
            &mut m.last_pulse_index,
        ] {
            col.remove(4);
        }
        m.azimuth.remove(4);
        m.zenith.remove(4);
    });
    assert_contains(
        &case.error(),
        &[
            &case.batch(1),
            &format!("rows {}..={} are not covered", rows.0, rows.1),
        ],
    );
}

#[test]
fn unknown_sensor() {
    let case = Case::new(|_, _, t2, _| t2.sensor_id[30] = 6000);
    assert_contains(
        &case.error(),
        &[
            &case.batch(2),
            "row 30, column `sensor_id`: sensor_id 6000",
            "sensor_geometry.csv",
        ],
    );
}

#[test]
fn duplicate_event_across_files() {
    let mut id = 0;
    let case = Case::new(|_, m1, t2, m2| {
        id = m1.event_id[7];
        let old = m2.event_id[2];
        m2.event_id[2] = id;
        for e in t2.event_id.iter_mut().filter(|e| **e == old) {
            *e = id;
        }
    });
    assert_contains(
        &case.error(),
        &[
            &format!("event {id} appears twice"),
            &case.batch(1),
            &case.batch(2),
        ],
    );
}

#[test]
fn truncated_and_corrupt_parquet() {
    let case = Case::new(|_, _, _, _| {});
    let path = case.batch(2);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_contains(&case.error(), &[&path, "not a readable Parquet file"]);
    let mut corrupt = bytes.clone();
    let n = corrupt.len();
    for b in &mut corrupt[n - 60..n - 8] {
        *b = 0xA5;
    }
    std::fs::write(&path, &corrupt).unwrap();
    assert_contains(&case.error(), &[&path, "not a readable Parquet file"]);
}

/// `path` with its footer rewritten after `edit` changed its decoded metadata (the column
/// data and page indexes stay where they were).
fn rewrite_footer(path: &Path, edit: impl FnOnce(ParquetMetaData) -> ParquetMetaData) {
    let bytes = std::fs::read(path).unwrap();
    let n = bytes.len();
    let footer = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let metadata = ParquetMetaDataReader::new()
        .parse_and_finish(&std::fs::File::open(path).unwrap())
        .unwrap();
    let mut rewritten = bytes[..n - 8 - footer].to_vec();
    ParquetMetaDataWriter::new(&mut rewritten, &edit(metadata))
        .finish()
        .unwrap();
    std::fs::write(path, rewritten).unwrap();
}

/// `metadata` with column chunk `column` of row group 0 changed by `edit`.
fn edit_chunk(
    metadata: ParquetMetaData,
    column: usize,
    edit: impl FnOnce(ColumnChunkMetaDataBuilder) -> ColumnChunkMetaDataBuilder,
) -> ParquetMetaData {
    let mut groups = metadata.row_groups().to_vec();
    let mut chunks = groups[0].columns().to_vec();
    chunks[column] = edit(chunks[column].clone().into_builder()).build().unwrap();
    groups[0] = groups[0]
        .clone()
        .into_builder()
        .set_column_metadata(chunks)
        .build()
        .unwrap();
    metadata.into_builder().set_row_groups(groups).build()
}

/// A change to one column chunk's metadata.
type ChunkEdit = fn(ColumnChunkMetaDataBuilder) -> ColumnChunkMetaDataBuilder;

/// The parquet crate asserts (panics) when a footer puts a column chunk at a negative offset
/// or gives it a negative length (found by flipping bits of a meta file): each is an error
/// naming the file, the row group and the column, as is a chunk that ends past the file.
#[test]
fn a_footer_placing_a_column_chunk_outside_the_file() {
    let edits: [(&str, ChunkEdit); 3] = [
        ("-946 bytes", |c| c.set_total_compressed_size(-946)),
        ("(data at -5)", |c| {
            c.set_data_page_offset(-5).set_dictionary_page_offset(None)
        }),
        ("1000000 bytes", |c| c.set_total_compressed_size(1_000_000)),
    ];
    for (what, edit) in edits {
        let case = Case::new(|_, _, _, _| {});
        let meta = case.dir.path().join("src/train_meta.parquet");
        rewrite_footer(&meta, |m| edit_chunk(m, 0, edit));
        let error = case.error();
        assert_contains(
            &error,
            &[
                &meta.display().to_string(),
                "not a readable Parquet file",
                "row group 0, column `",
                what,
                "outside the file's",
            ],
        );
    }
}

/// A footer that gives a row group more rows than its column chunks hold: an error naming
/// the file, the column and where it ends, not rows made up or silently dropped.
#[test]
fn a_row_group_shorter_than_its_footer_says() {
    let case = Case::new(|_, _, _, _| {});
    // The meta file: a batch file's row count is checked against its meta first.
    let meta = case.dir.path().join("src/train_meta.parquet");
    let mut rows = 0;
    rewrite_footer(&meta, |m| {
        let mut groups = m.row_groups().to_vec();
        rows = groups[0].num_rows();
        groups[0] = groups[0]
            .clone()
            .into_builder()
            .set_num_rows(rows + 5)
            .build()
            .unwrap();
        m.into_builder().set_row_groups(groups).build()
    });
    assert_contains(
        &case.error(),
        &[
            &meta.display().to_string(),
            "not a readable Parquet file",
            &format!(
                "column `batch_id` ends at row {rows} of the file, inside row group 0 \
                 (rows 0..{} by the footer)",
                rows + 5
            ),
        ],
    );
}

/// Bytes damaged anywhere in a batch or meta file (bits flipped, runs overwritten with
/// noise or zeros) either leave a file that still converts to exactly its rows (the damage
/// hit bytes no reader uses) or stop the conversion with an error naming the file; never a
/// panic, never a manifest after an error. 96 seeded cases (the same sweep run for 1,100
/// cases outside the tests found one panic, the footer's above).
#[test]
fn damaged_bytes_anywhere_are_an_error_or_harmless_never_a_panic() {
    let mut rng = shardify::rng::Rng::new(7);
    let (mut converted, mut failed) = (0, 0);
    for _ in 0..96 {
        let case = Case::new(|_, _, _, _| {});
        let src = case.dir.path().join("src");
        let file = match rng.below(3) {
            0 => src.join("train_meta.parquet"),
            k => src.join(format!("train/batch_{k}.parquet")),
        };
        let mut bytes = std::fs::read(&file).unwrap();
        // After the leading magic, before the trailing one and the footer length.
        let end = bytes.len() - 8;
        damage(&mut bytes, 4..end, &mut rng);
        std::fs::write(&file, &bytes).unwrap();
        match case.convert() {
            Ok(()) => {
                let source = InputSet::discover(&src, Some("train")).unwrap();
                let report = verify(&case.dir.path().join("out"), Some(&source)).unwrap();
                assert!(report.ok(), "{}: {:?}", file.display(), report.problems);
                converted += 1;
            }
            Err(e) => {
                assert_contains(&e.to_string(), &[&file.display().to_string()]);
                failed += 1;
            }
        }
    }
    assert!(
        converted > 0 && failed > 0,
        "both outcomes seen: {converted} converted, {failed} failed"
    );
}

#[test]
fn empty_batch_file_is_zero_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut next = 0;
    let (t, m) = generated_batch(1, 1, 12, &mut next, true);
    let empty = pulse_columns(&PulseTable::default());
    let case = Case::write(dir, vec![(1, pulse_columns(&t)), (2, empty)], &[&m]);
    case.convert().unwrap();
    assert_eq!(dump_lines(&case.dir.path().join("out")).len(), 12);
}

/// What real writers produce converts to the same dataset as the Kaggle-style original.
#[test]
fn accepted_variants_give_identical_events() {
    let mut next = 0;
    let (mut t, m) = generated_batch(4, 1, 60, &mut next, true);
    // Charges on a grid that float16 holds exactly (sixty-fourths below 32), so that a float16
    // file can compare equal.
    for charge in &mut t.charge {
        *charge = (*charge * 64.0).round() / 64.0;
    }
    let base = pulse_columns(&t);
    let reference = Case::write(tempfile::tempdir().unwrap(), vec![(1, base.clone())], &[&m]);
    reference.convert().unwrap();
    let expected = dump_lines(&reference.dir.path().join("out"));

    let sensor = |values| base.clone().with_column(Column::new("sensor_id", values));
    let widened = |v: &[i16]| v.iter().map(|&s| s as i32).collect::<Vec<_>>();
    let reordered = Table::new([4, 2, 0, 3, 1].map(|i| base.columns[i].clone()).to_vec());
    let extra = base.clone().with_column(Column::new(
        "dom_x",
        Values::Float64(vec![0.5; t.time.len()]),
    ));
    let snappy = || synth::writer_properties(Codec::Snappy);
    // What Spark's and pyarrow's encoding options write: no dictionary, delta-packed
    // integers, byte-stream-split floats, run-length booleans, in data pages v2.
    let encoded = || {
        let column = |name: &str| parquet::schema::types::ColumnPath::from(name);
        snappy()
            .set_writer_version(parquet::file::properties::WriterVersion::PARQUET_2_0)
            .set_dictionary_enabled(false)
            .set_column_encoding(column("event_id"), Encoding::DELTA_BINARY_PACKED)
            .set_column_encoding(column("time"), Encoding::DELTA_BINARY_PACKED)
            .set_column_encoding(column("sensor_id"), Encoding::DELTA_BINARY_PACKED)
            .set_column_encoding(column("charge"), Encoding::BYTE_STREAM_SPLIT)
            .set_column_encoding(column("auxiliary"), Encoding::RLE)
    };
    let variants = vec![
        (
            "sensor_id int32",
            sensor(Values::Int32(widened(&t.sensor_id))),
            snappy(),
            None,
        ),
        (
            "sensor_id uint32",
            sensor(Values::UInt32(
                t.sensor_id.iter().map(|&s| s as u32).collect(),
            )),
            snappy(),
            None,
        ),
        (
            "event_id uint64",
            base.clone().with_column(Column::new(
                "event_id",
                Values::UInt64(t.event_id.iter().map(|&e| e as u64).collect()),
            )),
            snappy(),
            None,
        ),
        (
            "float32 charge",
            base.clone().with_column(Column::new(
                "charge",
                Values::Float32(t.charge.iter().map(|&c| c as f32).collect()),
            )),
            snappy(),
            None,
        ),
        (
            "float16 charge",
            base.clone().with_column(Column::new(
                "charge",
                Values::Float16(t.charge.iter().map(|&c| half_bits(c)).collect()),
            )),
            snappy(),
            None,
        ),
        (
            "plain pages, no dictionary",
            base.clone(),
            snappy().set_dictionary_enabled(false),
            Some(333),
        ),
        (
            "data page v2",
            base.clone(),
            snappy().set_writer_version(parquet::file::properties::WriterVersion::PARQUET_2_0),
            None,
        ),
        (
            "delta, byte-stream-split and run-length encodings",
            base.clone(),
            encoded(),
            Some(700),
        ),
        ("columns reordered", reordered, snappy(), None),
        ("extra column", extra, snappy(), None),
        (
            "zstd, many row groups",
            base.clone(),
            synth::writer_properties(Codec::Zstd),
            Some(97),
        ),
        (
            "uncompressed",
            base.clone(),
            synth::writer_properties(Codec::Uncompressed),
            Some(1000),
        ),
        (
            "gzip",
            base.clone(),
            synth::writer_properties(Codec::Gzip),
            None,
        ),
        (
            "lz4 (hadoop framing)",
            base.clone(),
            synth::writer_properties(Codec::Lz4),
            None,
        ),
        (
            "lz4_raw",
            base.clone(),
            synth::writer_properties(Codec::Lz4Raw),
            Some(500),
        ),
        (
            "brotli",
            base.clone(),
            synth::writer_properties(Codec::Brotli),
            None,
        ),
    ];
    for (name, table, properties, row_groups) in variants {
        let case = Case::write(tempfile::tempdir().unwrap(), vec![(1, base.clone())], &[&m]);
        synth::write_parquet_with(
            Path::new(&case.batch(1)),
            &table,
            properties.build(),
            row_groups,
        )
        .unwrap();
        case.convert().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(dump_lines(&case.dir.path().join("out")), expected, "{name}");
    }

    // The encoded variant holds the encodings it names (RLE: the levels, and the booleans'
    // values), not a writer's fallback to plain or dictionary pages.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("encoded.parquet");
    synth::write_parquet_with(&path, &base, encoded().build(), Some(700)).unwrap();
    let footer = ParquetMetaDataReader::new()
        .parse_and_finish(&std::fs::File::open(&path).unwrap())
        .unwrap();
    let mut used = BTreeMap::<String, BTreeSet<Encoding>>::new();
    for chunk in footer.row_groups().iter().flat_map(|g| g.columns()) {
        let column = chunk.column_path().string();
        used.entry(column).or_default().extend(chunk.encodings());
    }
    let (delta, split, rle) = (
        Encoding::DELTA_BINARY_PACKED,
        Encoding::BYTE_STREAM_SPLIT,
        Encoding::RLE,
    );
    let expected = [
        ("event_id", vec![delta, rle]),
        ("time", vec![delta, rle]),
        ("sensor_id", vec![delta, rle]),
        ("charge", vec![split, rle]),
        ("auxiliary", vec![rle]),
    ]
    .map(|(column, encodings)| (column.to_string(), BTreeSet::from_iter(encodings)));
    assert_eq!(used, BTreeMap::from(expected));
}

/// The IEEE 754 half-precision bits of `value`, which float16 must hold exactly.
fn half_bits(value: f64) -> u16 {
    let half = half::f16::from_f64(value);
    assert_eq!(half.to_f64(), value, "{value} is not exact in float16");
    half.to_bits()
}

/// An unsigned 64-bit event id past `i64::MAX` is an error naming its row, not a wrapped
/// negative id.
#[test]
fn an_unsigned_value_past_the_signed_range_names_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut next = 0;
    let (t, m) = generated_batch(1, 1, 10, &mut next, true);
    let mut ids: Vec<u64> = t.event_id.iter().map(|&e| e as u64).collect();
    ids[23] = u64::MAX - 5;
    let ids = Column::new("event_id", Values::UInt64(ids));
    let case = Case::write(dir, vec![(1, pulse_columns(&t).with_column(ids))], &[&m]);
    assert_contains(
        &case.error(),
        &[
            &case.batch(1),
            &format!(
                "row 23, column `event_id`: {} does not fit a signed 64-bit integer",
                u64::MAX - 5
            ),
        ],
    );
}

#[test]
fn a_page_that_fails_its_checksum_is_an_error_naming_the_file() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("train")).unwrap();
    let fixture_dir = fixture().join("../page-crc");
    for file in ["train/batch_1.parquet", "train_meta.parquet"] {
        std::fs::copy(fixture_dir.join(file), src.join(file)).unwrap();
    }
    std::fs::copy(
        fixture().join("sensor_geometry.csv"),
        src.join("sensor_geometry.csv"),
    )
    .unwrap();
    let options = options(1, 1);
    convert_all(&src, "train", &dir.path().join("intact"), &options).unwrap();
    // 32 bytes in the middle of the `time` column's only page: plain, uncompressed values,
    // which would decode to other times if nothing checked the page's CRC.
    let batch = src.join("train/batch_1.parquet");
    let reader = SerializedFileReader::new(std::fs::File::open(&batch).unwrap()).unwrap();
    let time = reader.metadata().row_group(0).column(1).clone();
    assert_eq!(time.column_path().string(), "time");
    let middle = (time.data_page_offset() + time.compressed_size() / 2) as usize;
    let mut bytes = std::fs::read(&batch).unwrap();
    for b in &mut bytes[middle..middle + 32] {
        *b ^= 0x5a;
    }
    std::fs::write(&batch, &bytes).unwrap();
    let out = dir.path().join("damaged");
    let err = convert_all(&src, "train", &out, &options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("batch_1.parquet") && err.contains("CRC checksum mismatch"),
        "{err}"
    );
    assert!(!out.join("manifest.json").exists());
}
