"""Bad arguments and damaged data raise the documented exception types, naming the cause."""

import json
import os

import pytest
import shardify

BAD = [
    (dict(batch_events=0), "batch"),
    (dict(batch_events=-3), "batch_events"),
    (dict(layout="ragged"), "layout"),
    (dict(layout="padded"), "layout"),
    (dict(max_doms=8, pulses_per_dom=2), "max_doms"),
    (dict(max_events=10), "max_events"),
    (dict(batch_order="random"), "batch_order"),
    (dict(output="pandas"), "output"),
    (dict(device="tpu"), "device"),
    (dict(rank=3, world=2), "rank"),
    (dict(rank=1), "rank"),
    (dict(rank=0, world=0), "invalid world: must be at least 1"),
    (dict(workers=0), "workers"),
    (dict(prefetch=0), "prefetch"),
    # More staging buffers than the machine holds: refused, not killed for memory.
    (dict(prefetch=10**12), "invalid prefetch: .* staging buffers .* more than this"),
    (dict(workers=10**12), "invalid workers: .* staging buffers"),
    # Unless given, the batches ahead follow the workers (twice those that can run at once).
    (dict(workers=10**11, prefetch=None), r"invalid workers: 100000000000 workers and \d+ batches"),
    (dict(layout="padded", max_doms=64, pulses_per_dom=10**9), "invalid layout: one padded batch"),
    (dict(layout="padded", max_doms=0, pulses_per_dom=2), "max_doms of at least 1"),
    (dict(output="numpy", device="cuda"), "device"),
    (dict(layout="padded", max_doms=4, pulses_per_dom=1, dom_positions=False), "dom_positions"),
    (dict(seed=2**64), "invalid seed: 18446744073709551616 does not fit 64 bits"),
]


@pytest.mark.parametrize("kwargs,field", BAD)
def test_bad_arguments_raise_value_error_naming_the_field(train_dir, torch, kwargs, field):
    with pytest.raises(ValueError, match=field):
        shardify.Loader(train_dir, **kwargs)


def test_a_loader_whose_construction_raised_still_has_a_repr(train_dir, torch):
    """A traceback that shows its locals (pytest's, rich's) calls repr on a loader whose
    __init__ raised: it says so, where it raised AttributeError and hid the real error."""
    made = shardify.Loader(train_dir, batch_events=8, rank=1, world=2)
    assert repr(made) == (f"shardify.Loader({str(train_dir)!r}, rank 1 of 2, device cpu, "
                          "epoch 0)")
    broken = shardify.Loader.__new__(shardify.Loader)
    with pytest.raises(ValueError, match="layout"):
        broken.__init__(train_dir, layout="padded")
    assert repr(broken) == "shardify.Loader (not made: its construction raised)"


def test_bad_environment_rank(train_dir, torch, monkeypatch):
    monkeypatch.setenv("RANK", "one")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK"):
        shardify.Loader(train_dir)


@pytest.mark.parametrize("variable, value, expected", [
    ("SHARDIFY_PREFETCH_LEVEL", "l3", "must be l1 or l2"),
    ("SHARDIFY_COLUMNS_PASSES", "three", "must be one or two"),
])
def test_a_bad_gather_setting_in_the_environment_is_refused_naming_it(
        train_dir, monkeypatch, variable, value, expected):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=f'{variable}: {expected}, not "{value}"'):
        shardify.Loader(train_dir, output="numpy")


def test_bad_checksum_policy(train_dir):
    with pytest.raises(ValueError, match="checksums"):
        shardify.Dataset(train_dir, checksums="sometimes")


def test_a_file_is_not_a_dataset_directory(tmp_path):
    """A file's path (a shard's, a manifest's) is NotADirectoryError saying what a dataset
    is (was OSError: "FILE/manifest.json: Not a directory (os error 20)")."""
    file = tmp_path / "manifest.json"
    file.write_text("{}")
    with pytest.raises(NotADirectoryError, match=f"^{file}: not a directory: a dataset is the "
                                                 "directory `shardify convert` or"):
        shardify.Dataset(file)


def test_paths_as_bytes_are_taken_as_python_takes_them(train_dir, tmp_path):
    assert len(shardify.Dataset(os.fsencode(train_dir))) == 300
    assert len(shardify.Loader(os.fsencode(train_dir), batch_events=100, output="numpy")) == 3
    copy = os.fsencode(tmp_path / "copy")
    assert shardify.copy_dataset(os.fsencode(train_dir), copy)["outcome"] == "copied"


def test_a_missing_dataset_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere: no such dataset directory"):
        shardify.Dataset(tmp_path / "nowhere")
    assert issubclass(FileNotFoundError, OSError)
    # A directory that a conversion is still writing (or was killed writing) says so.
    (tmp_path / "unfinished" / ".work").mkdir(parents=True)
    unfinished = "manifest.json: not written yet: .* unfinished conversion"
    with pytest.raises(FileNotFoundError, match=unfinished):
        shardify.Dataset(tmp_path / "unfinished")


def flip_a_pulse_byte(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    shard = dataset / manifest["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF  # in the last tensor's bytes
    shard.write_bytes(bytes(data))
    return shard


def test_a_damaged_shard_raises_dataset_error(train_copy, torch):
    shard = flip_a_pulse_byte(train_copy)
    with pytest.raises(shardify.DatasetError, match=shard.name) as failure:
        shardify.Dataset(train_copy, checksums="full")
    assert "checksum" in str(failure.value)
    # Lazily checked: the epoch fails when it reaches the shard, with the same type.
    loader = shardify.Loader(shardify.Dataset(train_copy, checksums="lazy"), batch_events=16)
    with pytest.raises(shardify.DatasetError, match="checksum"):
        for _ in loader:
            pass


def test_a_truncated_shard_raises_dataset_error(train_copy, torch):
    manifest = json.loads((train_copy / "manifest.json").read_text())
    shard = train_copy / manifest["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(shardify.DatasetError, match=shard.name):
        for _ in shardify.Loader(shardify.Dataset(train_copy, checksums="off"), batch_events=16):
            pass


def test_a_manifest_whose_counts_disagree_raises_dataset_error(train_copy):
    """A count the loader plans from, damaged: refused when the dataset is opened (before, a
    shard said to hold 2^63 events aborted the interpreter in the sampler's allocation)."""
    path = train_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][1]["events"] = 2**63 + 5
    path.write_text(json.dumps(manifest))
    shard = manifest["shards"][1]["file"]
    with pytest.raises(shardify.DatasetError, match=f"manifest.json: shard {shard}: "
                       f"{2**63 + 5} events, .* cannot be"):
        shardify.Dataset(train_copy, checksums="off")


TRUNCATED_WHILE_READ = """
import os, sys, shardify
loader = shardify.Loader(shardify.Dataset(sys.argv[1], checksums="off"), batch_events=5,
                         output="numpy")
batches = iter(loader)
next(batches)
for name in os.listdir(sys.argv[1]):
    if name.startswith("shard_"):
        os.truncate(os.path.join(sys.argv[1], name), 100)
for _ in batches:
    pass
"""


@pytest.mark.parametrize("faulthandler", [False, True])
def test_a_shard_truncated_while_read_is_named_before_the_process_ends(train_copy, faulthandler):
    """A shard cut short while a loader maps it faults the reader (SIGBUS): nothing can go
    on, but the last line names the file and the byte, then the signal reaches what handled
    it before (Python's faulthandler, which prints the traceback, or the default). Was a bare
    "Bus error". Once, however many workers fault at once: their reports and faulthandler
    dumps ran together on a loaded machine (2 reports in 31 of 100 runs, 5 ending by
    SIGSEGV), which tests/fault_report.rs reproduces with eight threads."""
    import re
    import signal
    import subprocess
    import sys

    flags = ["-X", "faulthandler"] if faulthandler else []
    run = subprocess.run([sys.executable, *flags, "-c", TRUNCATED_WHILE_READ, str(train_copy)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGBUS, run
    reported = re.findall(r"shardify: bus error \(SIGBUS\) reading (\S+) at byte (\d+): the "
                          r"file is shorter than when it was mapped", run.stderr)
    assert len(reported) == 1, run.stderr
    path, offset = reported[0]
    assert path.startswith(f"{train_copy}/shard_") and int(offset) >= 100, run.stderr
    assert "`shardify copy`" in run.stderr
    assert ("Fatal Python error: Bus error" in run.stderr) == faulthandler, run.stderr


def test_dataset_error_is_catchable_from_the_package():
    assert issubclass(shardify.DatasetError, Exception)
    assert not issubclass(shardify.DatasetError, (ValueError, OSError))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_wrapped_in_a_torch_dataloader_says_to_iterate_it(train_dir, torch, workers):
    """torch's DataLoader takes a loader for a map-style dataset (it has a length) and asks
    for loader[i], in its worker processes too: refused with what to do instead."""
    from torch.utils.data import DataLoader

    wrapped = DataLoader(shardify.Loader(train_dir, batch_events=16), batch_size=None,
                         num_workers=workers)
    with pytest.raises(TypeError, match="iterate it directly instead of wrapping it in "
                                        r"torch.utils.data.DataLoader"):
        next(iter(wrapped))
    # A Dataset in its place, taken for a torch Dataset: the Loader is named instead of
    # "'Dataset' object is not subscriptable".
    dataset = shardify.Dataset(train_dir)
    wrapped = DataLoader(dataset, batch_size=16, num_workers=workers)
    with pytest.raises(TypeError, match=r"not indexed .* shardify.Loader\(dataset"):
        next(iter(wrapped))
    with pytest.raises(TypeError, match="not indexed"):
        dataset[0]
    # A mapped loader (GraphLoader among them), taken for one too.
    mapped = shardify.Loader(train_dir, batch_events=16).map(lambda batch, epoch: batch)
    wrapped = DataLoader(mapped, batch_size=None, num_workers=0)
    with pytest.raises(TypeError, match="a MappedLoader is not indexed: .* iterate it "
                                        "directly instead of wrapping it in "
                                        r"torch.utils.data.DataLoader"):
        next(iter(wrapped))
