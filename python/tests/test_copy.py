"""``shardify.copy_dataset`` and ``shardify copy``: the same dataset elsewhere, byte for
byte, or an exception and nothing left that reads as a dataset."""

import signal
import subprocess
import sys
import time

import pytest
import shardify
from conftest import locked_as_a_copy_would, run_cli
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
    assert (report["outcome"], report["written"], report["kept"]) == ("copied", report["bytes"], 0)
    batches = [shardify.Loader(d, batch_events=32, output="numpy", seed=3)
               for d in (train_dir, copy)]
    for ours, theirs in zip(*batches, strict=True):
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert (ours[name] == theirs[name]).all(), name


def stamps(directory):
    """Each file's inode and modification time: what writing it again changes."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.iterdir()}


def test_the_same_copy_again_is_there_and_writes_nothing(train_dir, tmp_path):
    copy = tmp_path / "ds"
    first = shardify.copy_dataset(train_dir, copy)
    before = stamps(copy)
    again = shardify.copy_dataset(train_dir, copy)
    assert (again["outcome"], again["written"], again["kept"]) == ("present", 0, 5)
    assert (again["shards"], again["bytes"]) == (first["shards"], first["bytes"])
    assert stamps(copy) == before


def test_a_stopped_copy_is_finished_keeping_what_it_copied(train_dir, tmp_path):
    """A copy stopped before its manifest (here: one shard and the manifest missing, and
    the marker a stopped copy leaves, written as docs/converting.md describes it)."""
    import json

    copy = tmp_path / "ds"
    shardify.copy_dataset(train_dir, copy)
    (copy / "manifest.json").unlink()
    gone = shardify.Dataset(train_dir).manifest["shards"][2]["file"]
    (copy / gone).unlink()
    marker = {"identity": shardify.Dataset(train_dir).identity, "layout": "columns",
              "source": str(train_dir)}
    (copy / ".tmp.copy.json").write_text(json.dumps(marker))
    with pytest.raises(FileNotFoundError, match="a copy that did not finish"):
        shardify.Dataset(copy)
    report = shardify.copy_dataset(train_dir, copy)
    assert (report["outcome"], report["kept"]) == ("resumed", 4)
    manifest = (train_dir / "manifest.json").stat().st_size
    assert report["written"] == (train_dir / gone).stat().st_size + manifest
    assert files(copy) == files(train_dir)


def test_a_damaged_copy_is_repaired_by_a_checked_copy(train_dir, tmp_path):
    copy = tmp_path / "ds"
    shardify.copy_dataset(train_dir, copy)
    damaged = flip_a_pulse_byte(copy)
    with pytest.raises(shardify.DatasetError, match="checksum"):
        for _ in shardify.Loader(copy, batch_events=32, output="numpy"):
            pass
    # By sizes, the copy is there; read file by file, the damaged one is copied again.
    assert shardify.copy_dataset(train_dir, copy)["outcome"] == "present"
    report = shardify.copy_dataset(train_dir, copy, check=True)
    assert (report["outcome"], report["kept"]) == ("repaired", 4)
    assert report["written"] == damaged.stat().st_size
    assert files(copy) == files(train_dir)
    assert shardify.copy_dataset(train_dir, copy, check=True)["outcome"] == "present"


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


def test_records_decode_by_the_documented_layout(train_dir, tmp_path):
    """docs/format.md's records layout, read with numpy alone, holds the columns' values."""
    import json

    import numpy as np
    from safetensors.numpy import load_file

    records_dir = tmp_path / "records"
    shardify.copy_dataset(train_dir, records_dir, layout="records")
    manifest = json.loads((records_dir / "manifest.json").read_text())
    for entry in manifest["shards"]:
        columns = load_file(train_dir / entry["file"])
        shard = load_file(records_dir / entry["file"])
        with open(records_dir / entry["file"], "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            metadata = json.loads(f.read(size))["__metadata__"]
        assert metadata["layout"] == "records"
        numpy_dtype = {"I16": "<i2", "I32": "<i4", "I64": "<i8", "F32": "<f4", "F64": "<f8"}
        s, t, c = (np.dtype(numpy_dtype[metadata[k]])
                   for k in ("dom_sensor_id", "pulse_time", "pulse_charge"))
        header = 24 if "event_azimuth" in shard else 8
        doms, pulses = shard["event_dom_offsets"], shard["event_pulse_offsets"]
        raw = shard["event_records"]
        np.testing.assert_array_equal(doms, columns["event_dom_offsets"])
        for e in range(len(shard["event_id"])):
            d0, d1, p0, p1 = doms[e], doms[e + 1], pulses[e], pulses[e + 1]
            at = e * header + d0 * (s.itemsize + 4) + p0 * (t.itemsize + c.itemsize + 1)
            nd, np_ = d1 - d0, p1 - p0
            wanted = [("<i8", 1, columns["event_id"][e:e + 1])]
            if header == 24:
                wanted += [("<f8", 1, columns["event_azimuth"][e:e + 1]),
                           ("<f8", 1, columns["event_zenith"][e:e + 1])]
            dom_offsets = columns["dom_pulse_offsets"]
            assert dom_offsets[d0] == p0
            wanted += [(s, nd, columns["dom_sensor_id"][d0:d1]),
                       ("<i4", nd, dom_offsets[d0 + 1:d1 + 1] - p0),
                       (t, np_, columns["pulse_time"][p0:p1]),
                       (c, np_, columns["pulse_charge"][p0:p1]),
                       ("u1", np_, columns["pulse_auxiliary"][p0:p1].view("u1"))]
            for dtype, n, expected in wanted:
                size = np.dtype(dtype).itemsize * n
                np.testing.assert_array_equal(raw[at:at + size].view(dtype), expected)
                at += size
        assert at == len(raw)


def test_ctrl_c_ends_a_copy_waiting_for_another(train_dir, tmp_path):
    """A copy waiting for another's lock (in flock, the GIL released) ends on Ctrl-C with
    ``KeyboardInterrupt``, leaving nothing; another signal Python handles lets it wait on."""
    copy = tmp_path / "copy"
    script = ("import signal, shardify\n"
              "signal.signal(signal.SIGUSR1, lambda *_: print('usr1', flush=True))\n"
              "print('ready', flush=True)\n"
              f"shardify.copy_dataset({str(train_dir)!r}, {str(copy)!r})\n")
    with locked_as_a_copy_would(copy):
        waiting = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        # Signalled once its handler is in: a fixed sleep could end before a loaded machine
        # had started Python and imported shardify, and SIGUSR1's default action ends a
        # process. A signal before the copy reaches its lock runs the handler all the same.
        assert waiting.stdout.readline() == "ready\n", waiting.communicate()
        time.sleep(0.5)
        waiting.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert waiting.poll() is None, waiting.communicate()
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)
    assert "usr1" in out
    assert waiting.returncode != 0 and "KeyboardInterrupt" in err, err
    assert "Interrupted system call" not in err
    assert list(copy.iterdir()) == []
