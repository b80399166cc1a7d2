"""tools/adapters_bench.py (what the model-ready adapters cost; gpu-check.sh runs it on a GPU)
runs end to end on the CPU and prints every row it promises, each a measured time."""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

ROWS = [
    "loader alone (Rust drain), per batch",
    "time_ordered, no cut",
    "time_ordered, max_pulses=64, keep=non_auxiliary_first",
    "time_ordered, max_pulses=64, keep=random",
    "time_ordered, max_pulses=64, keep=charge",
    "pad_pulses on the cut pulses, to the longest event",
    "pad_pulses on the cut pulses, to 64 (no host sync)",
    "the same grids by torch.split + pad_sequence (what it replaces)",
    "pulse_sequences to 64 (a transformer's input)",
    "knn_edges k=8 on the cut pulses, distances per pulse",
    "knn_edges k=8 on the cut pulses, distances per DOM (groups)",
    "to_pyg graphnet, knn=8, max_pulses=64 (the adapter)",
    "floor: memcpy of the adapter's output",
    "DynEdge step (width 0.05), forward + backward + AdamW",
]
ADAPTER, FLOOR, STEP = (ROWS.index(name) for name in (
    "to_pyg graphnet, knn=8, max_pulses=64 (the adapter)",
    "floor: memcpy of the adapter's output",
    "DynEdge step (width 0.05), forward + backward + AdamW"))
LOOP_ROWS = [
    "a training loop's steps on ready graphs (one sync per loop)",
    "the same loop calling to_pyg before each step",
]


def bench(train_dir, *extra: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "adapters_bench.py"), str(train_dir),
         "--batch-events", "32", "--batches", "3", "--width", "0.05", "--max-pulses", "64",
         *extra],
        capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def row_times(out: str) -> dict[str, float]:
    """The report's table: each "  name   N.NNN ms" row after its first line, by name, up
    to the first line that is not one."""
    rows = {}
    for line in out.splitlines()[1:]:
        match = re.fullmatch(r"  (\S.*?)\s+(-?\d+\.\d+) ms", line)
        if match is None:
            break
        rows[match.group(1)] = float(match.group(2))
    return rows


def assert_step_share(out: str, line_start: str, adapter: float, step: float) -> None:
    """The line starting with `line_start` prints "adapter / DynEdge step: N.N%" equal to
    adapter / step as far as the rows' rounding lets us tell: the report divides unrounded
    times while the rows show 3 decimals (2.186 / 17.420 ms may print 12.6%, not 12.5%)."""
    line = next((line for line in out.splitlines() if line.startswith(line_start)), None)
    assert line is not None, out
    match = re.search(r"adapter / DynEdge step: (\d+\.\d)%", line)
    assert match is not None, out
    printed = float(match.group(1)) / 100
    half_ms = 0.0005
    low = (adapter - half_ms) / (step + half_ms)
    high = (adapter + half_ms) / (step - half_ms)
    # The percentage itself is rounded to 0.1%.
    assert low - 0.0005 <= printed <= high + 0.0005, (printed, low, high, out)


def test_adapters_bench_times_every_row_and_the_training_loop(train_dir, torch):
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    from shardify.transforms import _KNN_BLOCK_COST_PAIRS as cpu_default

    default_cost = f"2^{cpu_default.bit_length() - 1}"
    out = bench(train_dir, "--training-loop", "--block-costs", f"2^10,{default_cost}")
    rows = row_times(out)
    # The floor's row names its size in MB after the words listed.
    floor = [name for name in rows if name.startswith(ROWS[FLOOR])]
    assert len(floor) == 1, out
    assert [name for name in rows if name not in floor] == (
        ROWS[:FLOOR] + ROWS[FLOOR + 1:] + LOOP_ROWS), out
    assert all(seconds > 0 for seconds in rows.values()), out
    assert "on cpu" in out.splitlines()[0], out
    # The summary lines, from the rows above.
    adapter, step = rows[ROWS[ADAPTER]], rows[ROWS[STEP]]
    assert_step_share(out, "adapter / loader: ", adapter, step)
    alone, adapted = rows[LOOP_ROWS[0]], rows[LOOP_ROWS[1]]
    cost = re.search(r"in a training loop the adapter costs (-?\d+\.\d+) ms per batch", out)
    assert cost is not None, out
    # Printed to 3 decimals from unrounded times: equal to the rows' difference within that.
    assert abs(float(cost.group(1)) - (adapted - alone)) < 0.002 + 1e-9, out
    # The block plans: the three named ones and the two asked for, each with its blocks and
    # padded pairs per batch and its time; the default cost asked for again gives the
    # default's blocks, and says so.
    plans = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^  (default|one per size class|fewest|2\^\d+) \(\d+\): (\d+\.\d) blocks per batch, "
        r"(\d+\.\d\d)M padded pairs, (\d+\.\d{3}) ms(?: \(the blocks of (.+)\))?$", out, re.M)}
    assert list(plans) == ["default", "one per size class", "fewest", "2^10", default_cost], out
    assert all(float(time) > 0 for _, _, time, _ in plans.values()), out
    assert plans[default_cost][3] == "default", out
    assert plans[default_cost][:2] == plans["default"][:2], out
    assert plans["one per size class"][3] is None and plans["fewest"][0] == "1.0", out


def test_adapters_bench_leaves_the_training_loop_to_gpus_unless_asked(train_dir, torch):
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    out = bench(train_dir)
    rows = row_times(out)
    assert not set(LOOP_ROWS) & set(rows), out
    assert "in a training loop" not in out, out
    assert ROWS[STEP] in rows, out


FUSED_ROWS = [
    "knn_edges k=8 on the cut pulses, one Triton kernel",
    "the adapter with the Triton kNN (SHARDIFY_KNN=fused)",
    "the same step, its kNN graphs by the Triton kernel",
]


def test_adapters_bench_times_the_triton_knn_when_asked(train_dir, torch):
    """--fused-knn on the CPU, the kernel in Triton's interpreter (a check that the rows run,
    not a timing): the kNN, the adapter and the DynEdge step again with the kernel, each a
    measured time, and the summary from them; without it, none of those rows."""
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    pytest.importorskip("triton")
    out = bench(train_dir, "--fused-knn", "--batch-events", "16", "--batches", "2",
                env=dict(os.environ, TRITON_INTERPRET="1"))
    rows = row_times(out)
    assert [name for name in rows if name in FUSED_ROWS] == FUSED_ROWS, out
    assert all(rows[name] > 0 for name in FUSED_ROWS), out
    adapter, step = rows[FUSED_ROWS[1]], rows[FUSED_ROWS[2]]
    assert "with the Triton kNN: adapter / loader: " in out, out
    assert_step_share(out, "with the Triton kNN: adapter / loader: ", adapter, step)
    assert "% (its step with the kernel" in out, out
    operations = re.search(r"; (\d+) torch operations per batch \(and one kernel\)", out)
    assert operations is not None, out
    # The floor of those operations: their count at one trivial operation's time, the same
    # time the torch path's floor line prints, and the adapter's row over it.
    floor = re.search(r"^with the Triton kNN the adapter's (\d+) operations cost at least "
                      r"(\d+\.\d{3}) ms at one trivial operation's time \((\d+\.\d)x the "
                      r"loader's time per batch; the adapter is (\d+\.\d)x that floor\)$",
                      out, re.M)
    assert floor is not None, out
    assert floor.group(1) == operations.group(1), out
    trivial = re.search(r"one trivial operation takes (\d+\.\d) us here", out)
    assert trivial is not None, out
    expected = int(floor.group(1)) * float(trivial.group(1)) / 1e3
    assert abs(float(floor.group(2)) - expected) <= int(floor.group(1)) * 0.05e-3 + 0.0005, out
    assert abs(float(floor.group(4)) - adapter / float(floor.group(2))) <= (
        0.05 + 0.01 * adapter / float(floor.group(2))), out
    assert not set(FUSED_ROWS) & set(row_times(bench(train_dir))), "rows only when asked"
