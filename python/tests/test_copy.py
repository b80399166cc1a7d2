"""``shardify.copy_dataset`` and ``shardify copy``: the same dataset elsewhere, byte for
byte, or an exception and nothing left behind."""

import pytest
import shardify
from conftest import run_cli
from test_errors import flip_a_pulse_byte


def files(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def test_a_copy_holds_the_same_files_and_loads_the_same_batches(train_dir, tmp_path):
    copy = tmp_path / "local" / "ds"
    report = shardify.copy_dataset(train_dir, copy)
    assert files(copy) == files(train_dir)
    assert report["shards"] == len(shardify.Dataset(train_dir).manifest["shards"]) == 4
    assert report["bytes"] == sum(len(b) for b in files(train_dir).values())
    assert report["seconds"] > 0
    batches = [shardify.Loader(d, batch_events=32, output="numpy", seed=3)
               for d in (train_dir, copy)]
    for ours, theirs in zip(*batches, strict=True):
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert (ours[name] == theirs[name]).all(), name


def test_a_destination_that_holds_anything_raises_file_exists(train_dir, tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="mine.txt"):
        shardify.copy_dataset(train_dir, tmp_path)
    assert files(tmp_path) == {"mine.txt": b"keep"}


def test_a_damaged_source_raises_dataset_error_and_leaves_nothing(train_copy, tmp_path):
    shard = flip_a_pulse_byte(train_copy)
    destination = tmp_path / "new"
    with pytest.raises(shardify.DatasetError, match=f"{shard.name}.*checksum"):
        shardify.copy_dataset(train_copy, destination)
    assert not destination.exists()


def test_the_console_script_copies(train_dir, tmp_path):
    out = run_cli("copy", str(train_dir), str(tmp_path / "ds"))
    assert "4 shards" in out and "checksums match" in out
    assert files(tmp_path / "ds") == files(train_dir)
