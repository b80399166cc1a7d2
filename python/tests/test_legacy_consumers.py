"""Older libraries and a missing torch: the library's read-only host arrays (a dataset's
event ids, a shard's tensors mapped read-only, an epoch's plan) reach consumers of the legacy
DLPack ABI (numpy before 2.1, torch before 2.9: no ``max_version``) as copies of their own;
the oldest numpy the package supports reads it; without torch a loader says what it needs."""

import os
import subprocess
import sys

import numpy as np
import pytest
import shardify
from conftest import IN_CI


class LegacyConsumer:
    """An array seen as a legacy consumer sees it: its ``__dlpack__`` called with ``stream``
    alone (today's numpy, whose first call passes ``max_version``, retries so when that
    call's keywords are refused)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def host_arrays(train_dir):
    """(name, HostArray) for a dataset's event ids and its first shard's tensors."""
    dataset = shardify.Dataset(train_dir)
    return [("event_ids", dataset._native.event_ids()), *dataset._native.shard_tensors(0)]


def test_a_legacy_consumer_gets_a_copy_of_a_read_only_array(train_dir):
    for name, array in host_arrays(train_dir):
        view = np.from_dlpack(array)
        assert not view.flags.writeable, f"{name}: the versioned export is read-only"
        legacy = np.from_dlpack(LegacyConsumer(array))
        assert legacy.dtype == view.dtype and legacy.shape == view.shape, name
        np.testing.assert_array_equal(legacy, view, err_msg=name)
        assert legacy.ctypes.data != view.ctypes.data, f"{name}: a view, not a copy"
        # Asked for no copy, a legacy export cannot say read-only: an error.
        with pytest.raises(BufferError, match="legacy DLPack ABI"):
            array.__dlpack__(copy=False)


def test_an_older_torch_may_write_into_its_copy(train_dir, torch):
    # torch before 2.9 makes a writable tensor of whatever a legacy capsule holds: a view of
    # a shard's read-only mapping would crash the process at the first write.
    for name, array in host_arrays(train_dir):
        before = np.from_dlpack(array).copy()
        tensor = torch.utils.dlpack.from_dlpack(array.__dlpack__())
        np.testing.assert_array_equal(tensor.numpy(), before, err_msg=name)
        tensor.zero_()
        np.testing.assert_array_equal(np.from_dlpack(array), before, err_msg=name)


# Run by the interpreter of a virtual environment that holds numpy 1.x and nothing else
# but the wheel (tools/test-all.sh makes it): the numpy-facing API, and a loader without
# torch. argv: dataset, event count.
OLD_NUMPY_PROBE = r"""
import sys
import numpy as np
import shardify
assert np.__version__.startswith("1."), np.__version__
dataset = shardify.Dataset(sys.argv[1])
ids = dataset.event_ids()
assert len(ids) == int(sys.argv[2]) == len(set(ids.tolist())), len(ids)
train, val = dataset.split(0.25, seed=3)
assert sorted(train.event_ids().tolist() + val.event_ids().tolist()) == sorted(ids.tolist())
delivered = [e for b in shardify.Loader(train, batch_events=32, output="numpy")
             for e in b["event_id"].tolist()]
assert sorted(delivered) == sorted(train.event_ids().tolist()), "every event once"
try:
    shardify.Loader(dataset)
except ModuleNotFoundError as missing:
    assert missing.name == "torch" and 'output="numpy"' in str(missing), missing
else:
    raise AssertionError("a torch loader made without torch")
print("numpy", np.__version__, len(delivered), "events")
"""


def test_the_oldest_numpy_reads_the_package(train_dir):
    python = os.environ.get("SHARDIFY_NUMPY1_PYTHON")
    if not python:
        if IN_CI:
            pytest.fail("SHARDIFY_NUMPY1_PYTHON is not set: tools/test-all.sh makes that venv")
        pytest.skip("SHARDIFY_NUMPY1_PYTHON names no interpreter with numpy 1.x")
    run = subprocess.run([python, "-c", OLD_NUMPY_PROBE, str(train_dir), "300"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("numpy 1."), run.stdout


def test_without_torch_a_loader_says_what_it_needs_and_numpy_output_works(train_dir):
    probe = r"""
import sys
sys.modules["torch"] = None  # import torch now fails as where it is not installed
import shardify
try:
    shardify.Loader(sys.argv[1])
except ModuleNotFoundError as missing:
    assert missing.name == "torch", missing
    print(missing)
batches = list(shardify.Loader(sys.argv[1], batch_events=100, output="numpy"))
print(sum(len(b["event_id"]) for b in batches))
"""
    run = subprocess.run([sys.executable, "-c", probe, str(train_dir)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    said, events = run.stdout.splitlines()
    assert "PyTorch is not installed here: pip install torch" in said, said
    assert 'output="numpy"' in said, said
    assert events == "300"


def test_a_torch_older_than_its_dlpack_bool_is_refused_by_name(train_dir):
    # torch 2.1 imports no DLPack bool: every batch failed with "Unsupported code 6".
    probe = r"""
import sys, types
old = types.ModuleType("torch")
old.__version__ = "2.1.2+cu121"
sys.modules["torch"] = old
import shardify
try:
    shardify.Loader(sys.argv[1])
except ImportError as refused:
    print(refused)
"""
    run = subprocess.run([sys.executable, "-c", probe, str(train_dir)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert "torch 2.2 or newer" in run.stdout and "this is torch 2.1.2+cu121" in run.stdout, \
        run.stdout
    assert 'output="numpy"' in run.stdout, run.stdout
