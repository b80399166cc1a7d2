"""No leak: many epochs and many short-lived loaders keep memory, threads and open files
flat (``tools/leak_check.py``, the script the long runs use, on the fixtures)."""

import json
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.parametrize("resident", [False, True])
def test_epochs_and_loaders_leave_nothing_behind(train_dir, torch, tmp_path, resident):
    report = tmp_path / "leaks.json"
    command = [sys.executable, str(REPO / "tools" / "leak_check.py"), str(train_dir),
               "--epochs", "60", "--loaders", "150", "--batch-events", "32",
               "--json", str(report)] + (["--resident"] if resident else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    figures = json.loads(report.read_text())
    assert figures["problems"] == []
    assert figures["last_epoch"]["events"] == 300
    for phase in ("epochs", "one_batch_loaders", "broken_off_loaders"):
        assert figures["rss_growth_mib"][phase] <= 2.0, phase
    first, last = figures["first_epoch"], figures["after_broken_off_loaders"]
    assert last["threads"] <= first["threads"] and last["files"] <= first["files"]
    assert figures["last_epoch"]["staging_allocations"] == first["staging_allocations"]
