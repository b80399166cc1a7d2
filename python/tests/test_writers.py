"""The Kaggle files as pyarrow writes them with the options users choose (codecs, encodings,
data page v2, page checksums, row groups, narrower or unsigned types, float16, required
columns, an index column as pandas keeps one, Parquet format 1.0) convert to the same
events as the originals: the converter reads what real writers produce, not only what the
parquet crate's writer (the Rust tests' files) produces. Each converted dataset is compared
event by event (``shardify dump``) and checked against its own source (``shardify verify
--against``), and each variant is checked to be in the files it wrote."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import FIXTURES, required_in_ci, run_cli

pa = required_in_ci("pyarrow")
pq = required_in_ci("pyarrow.parquet")

# The Kaggle files' pulse columns and types, which the variants change.
KAGGLE_TYPES = {"sensor_id": "int16", "time": "int64", "charge": "double", "auxiliary": "bool",
                "event_id": "int64"}


def sources() -> list[Path]:
    """The fixtures' train batch files, then their meta table, relative to the fixtures."""
    files = [*sorted((FIXTURES / "train").glob("*.parquet")), FIXTURES / "train_meta.parquet"]
    return [p.relative_to(FIXTURES) for p in files]


def unchanged(table: Any) -> Any:
    return table


def rewritten(root: Path, write: Callable[[Any, Path], None],
              change: Callable[[Any], Any] = unchanged) -> Path:
    """The fixtures' train split under ``root``: every Parquet file read by pyarrow, passed
    through ``change`` and written by ``write``; the geometry copied."""
    (root / "train").mkdir(parents=True)
    shutil.copy(FIXTURES / "sensor_geometry.csv", root)
    for relative in sources():
        write(change(pq.read_table(FIXTURES / relative)), root / relative)
    return root


def converted(source: Path) -> list[str]:
    """``source``'s train split converted (seed 42) and checked against it: its events as
    ``shardify dump`` prints them."""
    out = source.parent / f"{source.name}-ds"
    run_cli("convert", str(source), str(out), "--split", "train", "--seed", "42")
    run_cli("verify", str(out), "--against", str(source), "--split", "train")
    return run_cli("dump", str(out)).splitlines()


def cast(table: Any, types: dict[str, str]) -> Any:
    """``table`` with those of its columns named in ``types`` cast to them."""
    for name, type_ in types.items():
        if name in table.column_names:
            i = table.column_names.index(name)
            table = table.set_column(i, name, table[name].cast(type_))
    return table


def encoded(table: Any, path: Path) -> None:
    """Delta-packed integers, byte-stream-split floats and run-length booleans, no
    dictionary, data pages v2 (what Spark's and pyarrow's encoding options write)."""
    def encoding(type_: Any) -> str:
        if pa.types.is_integer(type_):
            return "DELTA_BINARY_PACKED"
        return "BYTE_STREAM_SPLIT" if pa.types.is_floating(type_) else "RLE"

    pq.write_table(table, path, use_dictionary=False, data_page_version="2.0",
                   column_encoding={f.name: encoding(f.type) for f in table.schema})


def indexed_and_required(table: Any) -> Any:
    """``table`` with the index column pandas writes for an index other than a range
    (``__index_level_0__``, first), and every column required (not nullable)."""
    index = pa.array(range(1000 + table.num_rows, 1000, -1), pa.int64())
    table = table.add_column(0, "__index_level_0__", index)
    return table.cast(pa.schema([field.with_nullable(False) for field in table.schema]))


def chunk(file: Any, name: str) -> Any:
    """Column ``name``'s chunk in the first row group of ``file`` (a ``pq.ParquetFile``)."""
    return file.metadata.row_group(0).column(file.schema_arrow.names.index(name))


class Variant(NamedTuple):
    write: Callable[[Any, Path], None]
    change: Callable[[Any], Any]
    # What the first batch file shows of the variant (a ``pq.ParquetFile`` given).
    shows: Callable[[Any], bool]


def written_with(**options: Any) -> Callable[[Any, Path], None]:
    return lambda table, path: pq.write_table(table, path, **options)


def compressed(codec: str) -> Variant:
    return Variant(written_with(compression=codec), unchanged,
                   lambda f: chunk(f, "time").compression == codec.upper())


VARIANTS: dict[str, Variant] = {
    "pyarrow's defaults": Variant(
        pq.write_table, unchanged,
        lambda f: "RLE_DICTIONARY" in chunk(f, "time").encodings),
    "zstd, plain pages, data page v2": Variant(
        written_with(compression="zstd", use_dictionary=False, data_page_version="2.0"),
        unchanged,
        lambda f: set(chunk(f, "time").encodings) == {"PLAIN", "RLE"}),
    "delta, byte-stream-split and run-length encodings": Variant(
        encoded, unchanged,
        lambda f: set(chunk(f, "time").encodings) == {"DELTA_BINARY_PACKED", "RLE"}
        and set(chunk(f, "charge").encodings) == {"BYTE_STREAM_SPLIT", "RLE"}
        and set(chunk(f, "auxiliary").encodings) == {"RLE"}),
    "lz4 (LZ4_RAW)": compressed("lz4"),
    "gzip": compressed("gzip"),
    "brotli": compressed("brotli"),
    "page checksums, 4 KiB pages, row groups of 1,000 rows": Variant(
        written_with(write_page_checksum=True, data_page_size=4096, row_group_size=1000),
        unchanged,
        lambda f: f.metadata.num_row_groups == -(-f.metadata.num_rows // 1000) > 1),
    "uint16 sensors, int32 times, float32 charge, unsigned ids": Variant(
        pq.write_table,
        lambda t: cast(t, {"sensor_id": "uint16", "time": "int32", "charge": "float32",
                           "event_id": "uint64", "batch_id": "uint32",
                           "first_pulse_index": "uint32", "last_pulse_index": "uint32"}),
        lambda f: [str(f.schema_arrow.field(n).type) for n in KAGGLE_TYPES]
        == ["uint16", "int32", "float", "bool", "uint64"]),
    "an index column, as pandas keeps one, and required columns": Variant(
        pq.write_table, indexed_and_required,
        lambda f: f.schema_arrow.names[0] == "__index_level_0__"
        and all(f.schema.column(i).max_definition_level == 0
                for i in range(len(f.schema_arrow.names)))),
    "Parquet format 1.0, no Arrow schema stored": Variant(
        written_with(version="1.0", store_schema=False), unchanged,
        lambda f: f.metadata.format_version == "1.0" and f.metadata.metadata is None),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[str]:
    """The original fixtures' events, converted."""
    source = tmp_path_factory.mktemp("reference") / "src"
    shutil.copytree(FIXTURES, source)
    return converted(source)


def test_the_fixtures_hold_the_kaggle_types():
    """What the variants change from: the Kaggle files' own types, dictionary pages and
    snappy."""
    first = pq.ParquetFile(FIXTURES / sources()[0])
    assert {n: str(first.schema_arrow.field(n).type) for n in KAGGLE_TYPES} == KAGGLE_TYPES
    assert not VARIANTS["gzip"].shows(first)
    assert not VARIANTS["an index column, as pandas keeps one, and required columns"].shows(
        first)


@pytest.mark.parametrize("name", VARIANTS)
def test_a_file_pyarrow_writes_converts_to_the_same_events(name, reference, tmp_path):
    variant = VARIANTS[name]
    source = rewritten(tmp_path / "src", variant.write, variant.change)
    assert variant.shows(pq.ParquetFile(source / sources()[0])), f"{name} is not in the file"
    events = converted(source)
    assert len(events) == len(reference) == 300
    assert events == reference


def test_float16_charge_reads_as_its_values(reference, tmp_path):
    """Charge written as float16 converts to the same events as the same (rounded) values
    written as float64, which differ from the originals: float16 is read, not skipped."""
    def half(table: Any) -> Any:
        return cast(table, {"charge": "float16"})

    source = rewritten(tmp_path / "f16", pq.write_table, half)
    assert str(pq.ParquetFile(source / sources()[0]).schema_arrow.field("charge").type) \
        == "halffloat"
    rounded = converted(rewritten(tmp_path / "f64", pq.write_table,
                                  lambda t: cast(half(t), {"charge": "float64"})))
    assert converted(source) == rounded
    assert rounded != reference
