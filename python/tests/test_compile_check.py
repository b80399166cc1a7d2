"""tools/compile_check.py (torch.compile on a DynEdge-shaped model whose layers call
knn_edges; gpu-check.sh runs it on a GPU) runs on the CPU: the compiled model's output is the
uncompiled one's, and Dynamo compiles a few graphs, not one set per batch."""

import re
import subprocess
import sys

from conftest import REPO


def test_the_compiled_model_matches_and_compiles_a_few_graphs(train_dir, torch):
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "compile_check.py"), str(train_dir),
         "--backend", "eager", "--batches", "4", "--width", "0.05"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "4 batches of 32 events on cpu, backend eager, the transforms called, untraced" in out
    seconds = re.search(r"seconds per batch: (.*)", out)
    assert seconds and len(seconds.group(1).split(", ")) == 4, out
    found = re.search(r"graphs (\d+), graph breaks (\d+), largest difference from the "
                      r"uncompiled model (\S+) \(the uncompiled model against itself (\S+)\)",
                      out)
    assert found, out
    graphs, breaks = int(found.group(1)), int(found.group(2))
    difference, floor = float(found.group(3)), float(found.group(4))
    assert 1 <= graphs <= 4 and breaks >= 1, out
    assert difference < 1e-5, out
    # On the CPU the uncompiled model is deterministic: run twice, its outputs are equal.
    assert floor == 0.0, out
