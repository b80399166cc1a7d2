"""The package itself: what `import shardify` loads, and what it ships."""

import subprocess
import sys
from pathlib import Path

import shardify


def test_import_loads_neither_torch_nor_numpy():
    # A fresh interpreter: this test process has imported both already.
    code = ("import sys, shardify; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_package_is_marked_typed():
    assert (Path(shardify.__file__).parent / "py.typed").is_file()
