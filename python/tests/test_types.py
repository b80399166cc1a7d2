"""Types: the stubs of the native module agree with it (stubtest), the package passes
``mypy --strict`` and the examples plain ``mypy``."""

import subprocess
import sys

import pytest
from conftest import IN_CI, REPO


def mypy(tmp_path, *args: str) -> str:
    """Runs ``python -m ARGS`` (mypy or its stubtest) with the project's configuration."""
    if not IN_CI:
        pytest.importorskip("mypy", reason="mypy is not installed")
    config = str(REPO / "pyproject.toml")
    if args[0] == "mypy.stubtest":
        options = ["--mypy-config-file", config]
    else:
        options = ["--cache-dir", str(tmp_path / "cache"), "--config-file", config]
    done = subprocess.run([sys.executable, "-m", *args, *options],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_native_stubs_match_the_module(tmp_path):
    # The installed package: stubs and compiled module side by side, as users get them.
    # The native module alone: stubtest of the pure-Python modules compares each with
    # itself, and under the configuration's Python 3.10 it finds on Python 3.13 that
    # every dataclass lacks the __replace__ which 3.13 adds.
    out = mypy(tmp_path, "mypy.stubtest", "shardify._native")
    assert "Success" in out


def test_package_is_strictly_typed(tmp_path):
    assert "Success" in mypy(tmp_path, "mypy", "--strict", "-p", "shardify")


def test_examples_type_check(tmp_path):
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.py"))
    assert len(examples) >= 4
    assert "Success" in mypy(tmp_path, "mypy", *examples)
