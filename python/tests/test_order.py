"""The loader's batches are exactly those of ``shardify order`` (the Rust sampler)."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import shardify
from conftest import ids, order_lines

SETTINGS = [
    # (Loader keyword arguments, the same for `shardify order`)
    (dict(batch_events=16), ["--batch-events", "16"]),
    (dict(batch_events=7, window_blocks=1, block_events=14, seed=3),
     ["--batch-events", "7", "--window", "1", "--block-events", "14", "--seed", "3"]),
    (dict(batch_events=16, batch_order="drawn", run_events=4),
     ["--batch-events", "16", "--batch-order", "drawn", "--run-events", "4"]),
    (dict(max_pulses=900, max_events=40), ["--max-pulses", "900", "--max-events", "40"]),
    (dict(max_pulses=900, pulse_cap=30, window_blocks=2),
     ["--max-pulses", "900", "--pulse-cap", "30", "--window", "2"]),
    (dict(batch_events=8, block_events=12, window_blocks=4, group_by_length=40),
     ["--batch-events", "8", "--block-events", "12", "--window", "4",
      "--group-by-length", "40"]),
    (dict(batch_events=16, shuffle=False, group_by_length=True),
     ["--batch-events", "16", "--no-shuffle", "--group-by-length"]),
    (dict(batch_events=8, window_blocks=2, group_by_length=20, length_of="doms"),
     ["--batch-events", "8", "--window", "2", "--group-by-length", "20", "--length-of",
      "doms"]),
    (dict(max_tokens=2048, group_by_length=64, block_events=64, window_blocks=2),
     ["--max-tokens", "2048", "--group-by-length", "64", "--block-events", "64", "--window",
      "2"]),
    (dict(max_tokens=240, max_events=20, group_by_length=True, length_of="doms",
          shuffle=False),
     ["--max-tokens", "240", "--max-events", "20", "--group-by-length", "--length-of", "doms",
      "--no-shuffle"]),
]


@pytest.mark.parametrize("kwargs,flags", SETTINGS)
def test_an_epoch_equals_shardify_order(train_dir, torch, kwargs, flags):
    loader = shardify.Loader(train_dir, device="cpu", **kwargs)
    length = len(loader)  # of epoch 0; afterwards len() is epoch 1's
    got = ids(loader)
    assert got == order_lines(train_dir, *flags)
    assert len(got) == length, "len() is the exact batch count"
    assert len(loader) == len(order_lines(train_dir, *flags, "--epoch", "1"))
    assert sum(map(len, got)) == 300, "every event once"


def test_consecutive_loops_are_consecutive_epochs(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=32, device="cpu")
    first, second = ids(loader), ids(loader)
    assert first == order_lines(train_dir, "--batch-events", "32", "--epoch", "0")
    assert second == order_lines(train_dir, "--batch-events", "32", "--epoch", "1")
    assert first != second
    loader.set_epoch(5)
    assert loader.epoch == 5
    assert ids(loader) == order_lines(train_dir, "--batch-events", "32", "--epoch", "5")


def test_numpy_output_gives_the_same_batches(train_dir):
    loader = shardify.Loader(train_dir, batch_events=16, output="numpy")
    batches = list(loader)
    assert ids(batches) == order_lines(train_dir, "--batch-events", "16")
    assert type(batches[0]["pulse_time"]).__module__ == "numpy"


RANK_SCRIPT = """
import json, sys, shardify
loader = shardify.Loader(sys.argv[1], batch_events=16, device="cpu")
print(json.dumps({"rank": loader.rank, "world": loader.world, "len": len(loader),
                  "ids": [b["event_id"].tolist() for b in loader]}))
"""


def test_world_3_as_three_processes(train_dir, torch):
    results = []
    procs = []
    for rank in range(3):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="3")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(train_dir)],
                                      env=env, stdout=subprocess.PIPE, text=True))
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.append(json.loads(out))
    union = []
    for rank, result in enumerate(results):
        assert (result["rank"], result["world"]) == (rank, 3), "rank and world from the env"
        # drop_last defaults to True when world > 1: the order of `order --drop-last`.
        expected = order_lines(train_dir, "--batch-events", "16", "--rank", str(rank),
                               "--world", "3", "--drop-last")
        assert result["ids"] == expected
        assert result["len"] == len(expected)
        union += result["ids"]
    counts = {len(r["ids"]) for r in results}
    assert len(counts) == 1, f"every rank the same number of batches: {counts}"
    flat = [e for batch in union for e in batch]
    assert len(flat) == len(set(flat)), "no event on two ranks"


def test_explicit_rank_and_world_without_drop_last(train_dir, torch):
    per_rank = [ids(shardify.Loader(train_dir, batch_events=16, rank=r, world=3, drop_last=False))
                for r in range(3)]
    for rank, got in enumerate(per_rank):
        assert got == order_lines(train_dir, "--batch-events", "16", "--rank", str(rank),
                                  "--world", "3")
    assert sorted(e for r in per_rank for b in r for e in b) == sorted(
        e for b in order_lines(train_dir, "--batch-events", "16") for e in b)


def _threads() -> dict[int, str]:
    """This process's threads: id and name."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                names[int(tid)] = comm.read().strip()
        except FileNotFoundError:  # ended while listed
            pass
    return names


def _batch_allowed() -> bool:
    """Whether the kernel lets a thread take SCHED_BATCH (a seccomp filter may refuse; the
    loader's workers then keep the process's policy)."""
    allowed = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            allowed.append(True)
        except PermissionError:
            allowed.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return allowed[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")
@pytest.mark.parametrize("scheduling", ["batch", "normal"])
def test_worker_scheduling_sets_the_gathering_threads_policy_not_the_order(
        train_dir, torch, scheduling):
    before = _threads()
    # One event per batch: far more batches than staging buffers, so with the first batch
    # held every worker is alive, waiting for a free buffer.
    loader = shardify.Loader(train_dir, batch_events=1, workers=3, device="cpu",
                             worker_scheduling=scheduling)
    batches = iter(loader)
    held = next(batches)
    # The first batch can come back before every worker has started (the waiting thread
    # gathers it itself, the first worker starts the others, and a thread names itself once
    # running; a clean-clone CI run saw two of three): wait for all three, 10 s at most.
    deadline = time.monotonic() + 10
    while True:
        started = {tid: name for tid, name in _threads().items() if tid not in before}
        if sorted(started.values()) == ["shardify-gather"] * 3 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert sorted(started.values()) == ["shardify-gather"] * 3
    expected = os.SCHED_BATCH if scheduling == "batch" and _batch_allowed() else os.SCHED_OTHER
    assert {os.sched_getscheduler(tid) for tid in started} == {expected}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER, "the training loop's thread changed"
    rest = ids(batches)
    assert [held["event_id"].tolist()] + rest == order_lines(train_dir, "--batch-events", "1")
    with pytest.raises(ValueError, match="worker_scheduling.*batch or normal.*fifo"):
        shardify.Loader(train_dir, worker_scheduling="fifo")


def test_consumer_gathers_changes_which_thread_gathers_not_the_batches(train_dir):
    def epoch(gathers):
        loader = shardify.Loader(train_dir, batch_events=3, workers=1, device="cpu",
                                 output="numpy", consumer_gathers=gathers)
        return [{name: array.tobytes() for name, array in batch.items()} for batch in loader]

    sleeping = epoch(False)
    assert len(sleeping) > 1
    assert epoch(True) == sleeping


@pytest.mark.parametrize("variable, values", [
    ("SHARDIFY_PREFETCH_LEVEL", ("l1", "l2")),
    ("SHARDIFY_COLUMNS_PASSES", ("one", "two")),
])
def test_the_gathers_machine_settings_change_no_batch(train_dir, monkeypatch, variable, values):
    def epoch(value):
        monkeypatch.setenv(variable, value)
        loader = shardify.Loader(train_dir, batch_events=5, window_blocks=4, device="cpu",
                                 output="numpy")
        return [{name: array.tobytes() for name, array in batch.items()} for batch in loader]

    first = epoch(values[0])
    assert len(first) > 1
    assert epoch(values[1]) == first


def pulse_counts(batch):
    """Each event's pulse count in a packed batch (numpy)."""
    event_doms = batch["event_dom_offsets"].astype("int64")
    return (batch["dom_pulse_offsets"].astype("int64")[event_doms][1:]
            - batch["dom_pulse_offsets"].astype("int64")[event_doms][:-1])


def padded_fill(batches, cap):
    """Pulses over the cells of grids padded to each batch's longest event cut to ``cap``."""
    import numpy as np

    real = cells = 0
    for batch in batches:
        counts = np.minimum(pulse_counts(batch), cap)
        real, cells = real + counts.sum(), cells + counts.size * counts.max()
    return real / cells


def test_group_by_length_batches_events_of_similar_length(realistic_dir):
    import numpy as np

    settings = dict(batch_events=32, block_events=64, window_blocks=8, output="numpy")
    drawn = list(shardify.Loader(realistic_dir, **settings))
    grouped = list(shardify.Loader(realistic_dir, group_by_length=256, **settings))
    assert len(grouped) == len(drawn)
    for window in range(0, len(drawn) - 15, 16):  # 16 batches of 32 a window of 512
        events = [np.sort(np.concatenate([b["event_id"] for b in run[window:window + 16]]))
                  for run in (drawn, grouped)]
        np.testing.assert_array_equal(*events, "a window's events, regrouped")
        lengths = sorted((np.minimum(pulse_counts(b), 256).min(),
                          np.minimum(pulse_counts(b), 256).max())
                         for b in grouped[window:window + 16])
        assert all(a[1] <= b[0] for a, b in zip(lengths, lengths[1:], strict=False)), lengths
    before, after = padded_fill(drawn, 256), padded_fill(grouped, 256)
    assert after > 0.8 > 0.5 > before, (before, after)


def test_grouped_by_dom_count_padded_batches_hold_less_padding(realistic_dir):
    settings = dict(batch_events=32, block_events=64, window_blocks=8, layout="padded",
                    max_doms=128, pulses_per_dom=2, output="numpy")
    cells = {}
    for grouped in (False, True):
        grouping = dict(group_by_length=128, length_of="doms") if grouped else {}
        batches = list(shardify.Loader(realistic_dir, **settings, **grouping))
        assert sum(len(b["event_id"]) for b in batches) == 3000
        assert all(b["dom_mask"].shape[1] <= 128 for b in batches)
        filled = sum(int(b["dom_mask"].sum()) for b in batches)
        cells[grouped] = sum(b["dom_mask"].size for b in batches)
        assert filled == sum(int((b["dom_features"][..., 3] > 0).sum()) for b in batches), \
            "a DOM row holds pulses where the mask is set"
    assert cells[True] < 0.6 * cells[False], cells


def test_group_by_length_refusals_name_it(train_dir):
    for value in (0, -3, 2.5, "256", None):
        with pytest.raises(ValueError, match="invalid group_by_length: expected False"):
            shardify.Loader(train_dir, group_by_length=value, output="numpy")
    with pytest.raises(ValueError, match="invalid group_by_length: groups batches of a fixed"):
        shardify.Loader(train_dir, max_pulses=900, group_by_length=True, output="numpy")
    with pytest.raises(ValueError, match="invalid length_of: `dom`: expected pulses or doms"):
        shardify.Loader(train_dir, group_by_length=True, length_of="dom", output="numpy")


def test_token_budget_refusals_name_it(train_dir):
    refusals = [
        (dict(max_tokens=4096), "invalid max_tokens: bounds the padded grid of batches grouped"),
        (dict(max_tokens=4096, max_pulses=900, group_by_length=True),
         "invalid max_tokens: give max_pulses .* or max_tokens .*, not both"),
        (dict(max_tokens=0, group_by_length=True),
         "invalid batching: token budget and event cap must be at least 1"),
        (dict(max_tokens=4096, max_events=0, group_by_length=True),
         "invalid batching: token budget and event cap must be at least 1"),
        (dict(max_tokens=-1, group_by_length=True), "invalid max_tokens: expected a non-neg"),
        (dict(max_events=8), "invalid max_events: applies with max_pulses or max_tokens only"),
        (dict(pulse_cap=64), "invalid pulse_cap: applies with max_pulses only"),
        (dict(pulse_cap=64, max_tokens=4096, group_by_length=True),
         "invalid pulse_cap: applies with max_pulses only"),
        (dict(max_pulses=900, pulse_cap=0), "invalid pulse_cap: must be at least 1"),
        (dict(pad_to_multiple_of=8), "invalid pad_to_multiple_of: applies with max_tokens only"),
        (dict(max_pulses=900, pad_to_multiple_of=8),
         "invalid pad_to_multiple_of: applies with max_tokens only"),
        (dict(max_tokens=4096, group_by_length=True, pad_to_multiple_of=0),
         "invalid pad_to_multiple_of: must be at least 1"),
        # Padded batches keep at most max_doms DOMs an event: a budget of their rows counts
        # them so (uncapped, an event of 300 DOMs would count 300 of 64 rows; capped at 16,
        # an event of 64 would count 16, and grids overrun the budget).
        (dict(max_tokens=4096, group_by_length=True, length_of="doms", layout="padded",
              max_doms=64, pulses_per_dom=4),
         "invalid group_by_length: uncapped, over the padded layout's max_doms 64: .* never "
         "fills, .* give group_by_length=64$"),
        (dict(max_tokens=4096, group_by_length=65, length_of="doms", layout="padded",
              max_doms=64, pulses_per_dom=4),
         "invalid group_by_length: a cap of 65, over the padded layout's max_doms 64"),
        (dict(max_tokens=4096, group_by_length=16, length_of="doms", layout="padded",
              max_doms=64, pulses_per_dom=4),
         "invalid group_by_length: a cap of 16, under the padded layout's max_doms 64: an "
         "event of more DOMs would count 16 rows where it fills up to 64, and grids would "
         "overrun max_tokens"),
        # Capped at max_doms, a budget under it: an event of more DOMs is a grid over it.
        (dict(max_tokens=48, group_by_length=64, length_of="doms", layout="padded",
              max_doms=64, pulses_per_dom=4),
         "invalid max_tokens: 48, under the padded layout's max_doms 64: an event of more "
         "than 48 DOMs would form a batch alone, a grid of up to 64 rows over the budget; give "
         "max_tokens of at least 64, or max_doms and group_by_length of 48$"),
    ]
    for kwargs, message in refusals:
        with pytest.raises(ValueError, match=message):
            shardify.Loader(train_dir, output="numpy", **kwargs)
    # Capped at max_doms, the grids keep within the budget; grouped by pulses, the budget
    # is the model's to apply (the padded grid is not of pulses).
    grids = [batch["dom_mask"].size for batch in shardify.Loader(
        train_dir, output="numpy", max_tokens=256, group_by_length=16, length_of="doms",
        layout="padded", max_doms=16, pulses_per_dom=2)]
    assert sum(grids) >= 300 and max(grids) <= 256
    shardify.Loader(train_dir, output="numpy", max_tokens=4096, group_by_length=True,
                    layout="padded", max_doms=64, pulses_per_dom=4)


def test_a_token_budget_gives_grids_of_nearly_equal_size(realistic_dir):
    """Batches cut by a budget of padded tokens: each grid (events times the batch's longest
    event, cut to 256 pulses) within the budget and most of them nearly full, where batches
    of a fixed count grouped alike range from a few to 32 x 256 cells."""
    import numpy as np

    settings = dict(block_events=64, window_blocks=8, group_by_length=256, output="numpy")
    grids = {}
    for name, batching in (("fixed", dict(batch_events=32)), ("tokens", dict(max_tokens=4096))):
        batches = list(shardify.Loader(realistic_dir, **settings, **batching))
        events = np.concatenate([b["event_id"] for b in batches])
        assert len(events) == len(np.unique(events)) == 3000, "every event once"
        counts = [np.minimum(pulse_counts(b), 256) for b in batches]
        grids[name] = np.array([c.size * c.max() for c in counts])
        if name == "tokens":
            assert all(grid <= 4096 or c.size == 1 for grid, c in zip(grids[name], counts,
                                                                      strict=True))
            sizes = [c.size for c in counts]
            assert max(sizes) >= 4 * min(sizes), "short events in big batches, long in small"
            # Cut from the longest down: every batch of events cut to 256 holds 16 of them,
            # a window's remainder falling among its shortest events.
            assert all(c.size == 16 for c in counts if c.max() == 256), sizes
            assert padded_fill(batches, 256) > 0.8
    # Six windows of 512 events, each with a last batch of its remainder: nearly all the
    # others at 90% of the budget or more (a batch is cut when the next event overruns it).
    assert (grids["tokens"] >= 0.9 * 4096).sum() >= len(grids["tokens"]) - 12, grids["tokens"]
    spread = {name: g.std() / g.mean() for name, g in grids.items()}
    assert spread["tokens"] < 0.5 * spread["fixed"], spread


def test_a_pulse_cap_fills_the_budget_with_the_pulses_a_model_keeps(realistic_dir):
    """A pulse budget for a GNN that cuts events to 64 pulses: counting each event's pulses
    up to 64, the batches hold nearly the budget in kept pulses (nodes); counting them all,
    with the real statistics, long events fill batches with pulses the model drops, and one
    longer than the budget is a batch alone."""
    import numpy as np

    kept = {}
    for name, cap in (("capped", 64), ("uncapped", None)):
        loader = shardify.Loader(realistic_dir, max_pulses=2048, pulse_cap=cap, window_blocks=4,
                                 output="numpy")
        counts = [np.diff(b["dom_pulse_offsets"][b["event_dom_offsets"]]) for b in loader]
        assert sum(c.size for c in counts) == 3000
        kept[name] = np.array([np.minimum(c, 64).sum() for c in counts])
        if cap is not None:
            assert kept[name].max() <= 2048
            # Each batch is closed by an event of at most 64 kept pulses that did not fit.
            assert (kept[name][:-1] > 2048 - 64).all(), kept[name]
    assert kept["capped"].mean() > 0.97 * 2048
    assert kept["uncapped"].mean() < 0.8 * 2048, kept["uncapped"].mean()
    assert len(kept["capped"]) < 0.8 * len(kept["uncapped"]), "fewer steps for as many events"
