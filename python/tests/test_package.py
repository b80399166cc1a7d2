"""The package itself: what `import shardify` loads, and what it ships."""

import os
import subprocess
import sys
from pathlib import Path

import shardify
from conftest import run_cli, shardify_command


def test_import_loads_neither_torch_nor_numpy():
    # A fresh interpreter: this test process has imported both already.
    code = ("import sys, shardify; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_package_is_marked_typed():
    assert (Path(shardify.__file__).parent / "py.typed").is_file()


def test_the_tests_run_against_the_installed_wheel_without_rust():
    """tools/test-all.sh runs these tests on the wheel in a venv without cargo on PATH."""
    import os
    import shutil
    import sysconfig

    if os.environ.get("SHARDIFY_TESTING_WHEEL") != "1":
        import pytest

        pytest.skip("not run by tools/test-all.sh (SHARDIFY_TESTING_WHEEL unset)")
    assert shutil.which("cargo") is None and shutil.which("rustc") is None
    installed = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(shardify.__file__).resolve().is_relative_to(installed), shardify.__file__
    package = Path(shardify.__file__).parent
    # What the wheel must hold: the native module, its stubs, the typing marker, the
    # Python layer and the console script.
    assert list(package.glob("_native*.so")), "the native module"
    for name in ("_native.pyi", "py.typed", "transforms.py", "torch_geometric.py",
                 "_resident/gather.py"):
        assert (package / name).is_file(), name
    assert (Path(sys.executable).parent / "shardify").is_file()


def test_the_console_script_ends_quietly_when_its_reader_has_gone(train_dir):
    """`shardify order DS | head -1`: the reader closes the pipe; the command stops with
    the status a shell gives a command ended by SIGPIPE, and writes nothing to stderr."""
    read, write = os.pipe()
    os.close(read)  # before the command starts: no race with its first line
    try:
        done = subprocess.run([shardify_command(), "order", str(train_dir)], stdout=write,
                              stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_the_wheel_generates_a_source_that_converts_and_verifies(tmp_path):
    """`shardify generate`, shipped in the wheel: a user without Rust makes synthetic data
    of any size (here the test split, zstd, one meta per batch), converts it and checks every
    pulse against it."""
    src, ds = tmp_path / "src", tmp_path / "ds"
    generated = run_cli("generate", str(src), "--events", "700", "--files", "3", "--split",
                        "test", "--codec", "zstd", "--meta-per-batch", "--seed", "9")
    assert generated.startswith("wrote 700 events, ") and f" in 3 files to {src} (" in generated
    pulses = int(generated.split(", ")[1].split()[0])
    assert sorted(p.name for p in (src / "test").iterdir()) == [
        f"batch_{n}.parquet" for n in (1, 2, 3)]
    assert sorted(p.name for p in (src / "test_meta").iterdir()) == [
        f"batch_{n}.parquet" for n in (1, 2, 3)]
    assert (src / "sensor_geometry.csv").is_file()
    converted = run_cli("convert", str(src), str(ds), "--split", "test")
    assert converted.startswith("converted 700 events, "), converted
    assert f" {pulses} pulses into" in converted, converted
    verified = run_cli("verify", str(ds), "--against", str(src), "--split", "test")
    assert f"700 events, {pulses} pulses, 700 source events compared" in verified, verified
    # A second run into the same directory is refused, and what is there stays.
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    again = subprocess.run([shardify_command(), "generate", str(src), "--split", "test"],
                           capture_output=True, text=True)
    assert again.returncode == 1 and "refusing to write into it" in again.stderr, again.stderr
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before
