"""Shared fixtures: datasets converted from the committed fixtures by the installed
``shardify`` console script (so every test run also checks the command line of the pip
install), and helpers that read the shards independently with ``safetensors.numpy``."""

from __future__ import annotations

import fcntl
import gc
import importlib
import os
import shutil
import subprocess
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "kaggle-mini"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def shardify_command() -> str:
    """The console script installed beside this interpreter (not cargo's binary)."""
    script = Path(sys.executable).parent / "shardify"
    assert script.exists(), f"the package's console script is missing: {script}"
    return str(script)


@contextmanager
def locked_as_a_copy_would(directory: Path) -> Iterator[None]:
    """Makes ``directory`` and holds the lock a copy into it takes (flock on the directory)."""
    directory.mkdir()
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def run_cli(*args: str) -> str:
    """Runs the installed ``shardify`` and returns its stdout; fails the test on an error."""
    done = subprocess.run([shardify_command(), *args], capture_output=True, text=True)
    assert done.returncode == 0, f"shardify {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


def order_lines(dataset: Path, *args: str) -> list[list[int]]:
    """``shardify order``: each batch's event ids."""
    out = run_cli("order", str(dataset), *args)
    return [[int(x) for x in line.split()] for line in out.splitlines()]


def generated_source(root: Path, events: int, files: int) -> Path:
    """``events`` generated events with the real statistics in ``files`` batch files, in
    ``root / "src"``, by the installed console script's ``shardify generate``."""
    run_cli("generate", str(root / "src"), "--events", str(events), "--files", str(files))
    return root / "src"


@pytest.fixture(scope="session")
def realistic_dir(tmp_path_factory):
    """3,000 generated events with the real statistics (``shardify generate``)."""
    root = tmp_path_factory.mktemp("realistic")
    run_cli("convert", str(generated_source(root, 3000, 2)), str(root / "ds"), "--seed", "3")
    return root / "ds"


def required_in_ci(name: str):
    """The module ``name``: required in CI (missing there, a failure, not a skip), where
    the README's test command installs it; elsewhere the test skips without it."""
    if IN_CI:
        return importlib.import_module(name)
    return pytest.importorskip(name)


@pytest.fixture(scope="session")
def torch():
    """torch, required in CI."""
    return required_in_ci("torch")


@pytest.fixture(scope="session")
def lightning():
    """PyTorch Lightning, required in CI."""
    return required_in_ci("lightning")


@pytest.fixture(scope="session")
def train_dir(tmp_path_factory) -> Path:
    """The fixtures' train split in 4 small shards (300 events, labelled)."""
    out = tmp_path_factory.mktemp("data") / "train"
    run_cli("convert", str(FIXTURES), str(out), "--split", "train", "--seed", "42",
            "--shard-size", "64KiB")
    return out


@pytest.fixture(scope="session")
def test_dir(tmp_path_factory) -> Path:
    """The fixtures' test split (no labels)."""
    out = tmp_path_factory.mktemp("data") / "test"
    run_cli("convert", str(FIXTURES), str(out), "--split", "test", "--seed", "42")
    return out


@pytest.fixture(scope="session")
def kaggle_dataset(tmp_path_factory) -> Path:
    """The real public Kaggle sample beside the checkout (test split: 3 events, no labels),
    converted; in CI its absence is a failure, elsewhere a skip."""
    sample = REPO.parent / "shared" / "data" / "kaggle-sample"
    if not sample.is_dir():
        if IN_CI:
            pytest.fail(f"{sample} is missing: CI runs with ../shared beside the checkout")
        pytest.skip(f"the real Kaggle sample is not here ({sample})")
    out = tmp_path_factory.mktemp("data") / "kaggle"
    run_cli("convert", str(sample), str(out), "--split", "test", "--seed", "1")
    return out


@pytest.fixture()
def train_copy(train_dir, tmp_path) -> Path:
    """A private copy of the train dataset, for tests that damage it."""
    return Path(shutil.copytree(train_dir, tmp_path / "copy"))


class StoredEvents:
    """Every event of a dataset read straight from its shard files with safetensors."""

    def __init__(self, dataset: Path):
        import json

        from safetensors.numpy import load_file

        manifest = json.loads((dataset / "manifest.json").read_text())
        self.shards = [load_file(dataset / s["file"]) for s in manifest["shards"]]
        self.positions = load_file(dataset / "geometry.safetensors")["sensor_position"]
        self.where = {}
        for s, shard in enumerate(self.shards):
            for i, event_id in enumerate(shard["event_id"]):
                self.where[int(event_id)] = (s, i)

    def event(self, event_id: int) -> dict[str, np.ndarray]:
        """One event's DOMs and pulses, as stored."""
        s, i = self.where[event_id]
        shard = self.shards[s]
        d0, d1 = shard["event_dom_offsets"][i], shard["event_dom_offsets"][i + 1]
        p = shard["dom_pulse_offsets"]
        out = {
            "dom_sensor_id": shard["dom_sensor_id"][d0:d1],
            "dom_pulse_counts": np.diff(p[d0:d1 + 1]),
            "pulse_time": shard["pulse_time"][p[d0]:p[d1]],
            "pulse_charge": shard["pulse_charge"][p[d0]:p[d1]],
            "pulse_auxiliary": shard["pulse_auxiliary"][p[d0]:p[d1]],
        }
        if "event_azimuth" in shard:
            out["event_azimuth"] = shard["event_azimuth"][i]
            out["event_zenith"] = shard["event_zenith"][i]
        return out


@pytest.fixture(scope="session")
def stored(train_dir) -> StoredEvents:
    return StoredEvents(train_dir)


def take(loader, steps: int) -> list[list[int]]:
    """The event ids of the loader's next ``steps`` batches, taken without asking it for
    another (as PyTorch Lightning takes ``len(loader)`` batches)."""
    return [b["event_id"].tolist() for _, b in zip(range(steps), loader, strict=False)]


def logging_guard(log: list):
    """A stand-in for a device guard (``torch.cuda.device``, ``launching_on``): entering it
    logs ``("guard", device)``, leaving it ``"left"``."""

    @contextmanager
    def guard(device):
        log.append(("guard", device))
        yield
        log.append("left")

    return guard


def ids(batches) -> list[list[int]]:
    """Each batch's event ids as lists."""
    return [np.asarray(b["event_id"]).tolist() for b in batches]


def span(tensor) -> tuple[int, int]:
    """The bytes a tensor's elements occupy: [first, end)."""
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def assert_freed(made: weakref.ref, what: str) -> None:
    """Checks that ``what``, referred to by ``made``, was freed (a loader made again drops
    what it was made with, though an iterator made before is still held)."""
    gc.collect()
    assert made() is None, f"{what} is still held, by an iterator made before"


def assert_a_held_batch_survives(loader, torch, later: int) -> None:
    """Keeps two tensors and a slice of the loader's first batch, takes the ``later``
    batches that follow, and checks that none was written into the held memory and that
    the held tensors and the slice are unchanged."""
    it = iter(loader)
    held = next(it)
    kept_ids, kept_time = held["event_id"], held["pulse_time"]
    copies = {k: v.clone() for k, v in held.items()}
    held_spans = [span(t) for t in held.values()]
    del held  # two tensors (and the slice below) keep its memory
    view = kept_time[1:]
    taken = 0
    for batch in it:
        for t in batch.values():
            s, e = span(t)
            assert all(e <= hs or s >= he for hs, he in held_spans if he > hs), \
                "a later batch was written into the held batch's memory"
        taken += 1
    assert taken == later
    assert torch.equal(kept_ids, copies["event_id"])
    assert torch.equal(kept_time, copies["pulse_time"])
    assert torch.equal(view, copies["pulse_time"][1:])


def assert_same_batches(streamed, resident, torch) -> None:
    """Section for section, dtype for dtype, value for value, batch for batch (two lists
    of batches, at least one each)."""
    assert len(streamed) == len(resident) > 0
    for k, (want, got) in enumerate(zip(streamed, resident, strict=True)):
        assert list(got) == list(want), f"batch {k}: sections {list(got)}"
        for name in want:
            a, b = want[name], got[name]
            assert (b.dtype, tuple(b.shape)) == (a.dtype, tuple(a.shape)), f"{k} {name}"
            assert torch.equal(a, b), f"batch {k}: {name} differs"
