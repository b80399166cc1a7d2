"""The package itself: what `import shardify` loads, and what it ships."""

import os
import subprocess
import sys
from pathlib import Path

import shardify
from conftest import shardify_command


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
