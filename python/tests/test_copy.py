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


def test_a_records_copy_loads_the_same_batches_streamed_and_resident(train_dir, tmp_path, torch):
    records = tmp_path / "records"
    report = shardify.copy_dataset(train_dir, records, layout="records")
    assert report["bytes"] == sum(len(b) for b in files(records).values())
    dataset = shardify.Dataset(records)
    assert dataset.manifest["schema"]["layout"] == "records"
    # A records shard's tensors are its events' columns, decoded.
    names = [name for name, _ in dataset._native.shard_tensors(0)]
    assert "pulse_time" in names and "event_records" not in names
    settings = dict(batch_events=24, window_blocks=4, block_events=16, seed=5, device="cpu")
    for resident in (False, True):
        loaders = [shardify.Loader(d, resident=resident, **settings) for d in (train_dir, records)]
        for ours, theirs in zip(*loaders, strict=True):
            assert list(ours) == list(theirs)
            for name in ours:
                assert torch.equal(ours[name], theirs[name]), (resident, name)
    back = tmp_path / "back"
    shardify.copy_dataset(records, back, layout="columns")
    assert files(back) == files(train_dir)
    with pytest.raises(ValueError, match="rows"):
        shardify.copy_dataset(train_dir, tmp_path / "other", layout="rows")


def test_the_console_script_copies_in_a_layout(train_dir, tmp_path):
    out = run_cli("copy", str(train_dir), str(tmp_path / "ds"), "--layout", "records")
    assert "(records layout)" in out and "checksums match" in out
    assert shardify.Dataset(tmp_path / "ds").manifest["schema"]["layout"] == "records"
