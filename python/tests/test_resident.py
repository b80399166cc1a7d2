"""Resident mode: the same batches as the streaming loader, gathered from columns held
whole on the device (here the CPU), with no data-dependent size per batch."""

import gc
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest
import shardify
from conftest import (
    REPO,
    assert_a_held_batch_survives,
    assert_freed,
    assert_same_batches,
    logging_guard,
)
from shardify._resident import buffers, columns, source

SETTINGS = [
    pytest.param(dict(batch_events=24, window_blocks=2, block_events=16), id="events"),
    pytest.param(dict(max_pulses=900, max_events=40, batch_order="drawn", run_events=3),
                 id="pulse-budget-drawn"),
    pytest.param(dict(batch_events=32, window_blocks=1 << 20), id="whole-dataset-window"),
    pytest.param(dict(batch_events=16, layout="padded", max_doms=20, pulses_per_dom=3),
                 id="padded"),
    pytest.param(dict(max_pulses=2000, layout="padded", max_doms=6, pulses_per_dom=1,
                      window_blocks=3), id="padded-pulse-budget"),
    pytest.param(dict(batch_events=20, dom_positions=False), id="no-positions"),
    pytest.param(dict(batch_events=12, window_blocks=3, group_by_length=50),
                 id="grouped-by-length"),
    pytest.param(dict(batch_events=12, window_blocks=3, layout="padded", max_doms=20,
                      pulses_per_dom=2, group_by_length=20, length_of="doms"),
                 id="padded-grouped-by-doms"),
    pytest.param(dict(max_tokens=600, max_events=16, window_blocks=3, group_by_length=50),
                 id="token-budget"),
    pytest.param(dict(max_tokens=100, window_blocks=2, layout="padded", max_doms=20,
                      pulses_per_dom=2, group_by_length=20, length_of="doms"),
                 id="padded-token-budget-of-doms"),
    pytest.param(dict(batch_events=7, rank=1, world=3, seed=4), id="rank-1-of-3"),
]


def epoch(loader):
    """One epoch, each batch's tensors cloned (so batches can be kept and compared)."""
    return [{k: v.clone() for k, v in batch.items()} for batch in loader]


@pytest.mark.parametrize("settings", SETTINGS)
def test_resident_batches_equal_streaming_ones(train_dir, torch, settings):
    settings = {"seed": 9, **settings}
    streaming = shardify.Loader(train_dir, device="cpu", **settings)
    resident = shardify.Loader(train_dir, device="cpu", resident=True, **settings)
    assert resident.resident and resident.device == torch.device("cpu")
    assert resident.section_names == streaming.section_names
    for e in range(2):  # two epochs: each `for` is the next one
        assert len(resident) == len(streaming)
        assert_same_batches(epoch(streaming), epoch(resident), torch)
        assert resident.epoch == streaming.epoch == e + 1


def test_workers_and_prefetch_do_nothing_resident(train_dir, torch):
    # A streaming loader refuses staging buffers no machine holds; a resident one holds none.
    with pytest.raises(ValueError, match="invalid prefetch"):
        shardify.Loader(train_dir, device="cpu", prefetch=10**12)
    resident = shardify.Loader(train_dir, device="cpu", resident=True, prefetch=10**12,
                               workers=10**12)
    usual = shardify.Loader(train_dir, device="cpu", resident=True)
    assert_same_batches(epoch(usual), epoch(resident), torch)
    # Values that are no count at all are still refused.
    for bad in (dict(workers=-1), dict(prefetch=0)):
        with pytest.raises(ValueError, match=f"invalid {next(iter(bad))}"):
            shardify.Loader(train_dir, device="cpu", resident=True, **bad)


def test_an_unlabelled_dataset_has_no_label_sections(test_dir, torch):
    streamed = epoch(shardify.Loader(test_dir, batch_events=50, device="cpu"))
    resident = epoch(shardify.Loader(test_dir, batch_events=50, device="cpu", resident=True))
    assert "event_azimuth" not in resident[0]
    assert_same_batches(streamed, resident, torch)


def test_the_real_kaggle_sample(kaggle_dataset, torch):
    for settings in (dict(batch_events=2), dict(batch_events=3, layout="padded", max_doms=40,
                                                 pulses_per_dom=4)):
        streamed = epoch(shardify.Loader(kaggle_dataset, device="cpu", **settings))
        resident = epoch(shardify.Loader(kaggle_dataset, device="cpu", resident=True,
                                         **settings))
        assert_same_batches(streamed, resident, torch)


def test_a_whole_dataset_window_is_a_complete_shuffle(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=30, window_blocks=1 << 20, seed=2,
                             device="cpu", resident=True)
    where = shardify.Dataset(train_dir).manifest["shards"]
    first_shard_end = where[0]["events"]
    plan = loader._batches._plan_at(0, 0, 0)
    events = plan.events.tolist()
    assert sorted(events) == list(range(300))
    # Every batch mixes events of several shards (blocks of 256 could not: a shard here
    # holds under 100 events, so one block would be one or two shards' worth in order).
    spans = [max(events[a:z]) - min(events[a:z])
             for a, z in zip(plan.starts, plan.starts[1:], strict=False)]
    assert min(spans) > first_shard_end


def test_offsets_are_int64_past_the_threshold(train_dir, torch, monkeypatch):
    settings = dict(batch_events=24, seed=5)
    narrow = shardify.Loader(train_dir, device="cpu", resident=True, **settings)
    assert narrow._batches.columns.event_dom_offsets.dtype == torch.int32
    monkeypatch.setattr(columns, "I64_OFFSETS_FROM", 1000)  # the dataset has 9400 DOMs
    wide = shardify.Loader(train_dir, device="cpu", resident=True, **settings)
    held = wide._batches.columns
    assert held.event_dom_offsets.dtype == held.dom_pulse_offsets.dtype == torch.int64
    total = shardify.Dataset(train_dir)
    assert int(held.dom_pulse_offsets[-1]) == total.pulses
    assert int(held.event_dom_offsets[-1]) == total.doms
    wide_epoch = epoch(wide)
    assert_same_batches(epoch(narrow), wide_epoch, torch)
    assert_same_batches(epoch(shardify.Loader(train_dir, device="cpu", **settings)),
                        wide_epoch, torch)


def test_the_columns_are_the_shards_concatenated(train_dir, stored, torch):
    held = shardify.Loader(train_dir, device="cpu", resident=True)._batches.columns
    shards = stored.shards
    for name in ("event_id", "event_azimuth", "dom_sensor_id", "pulse_time", "pulse_charge",
                 "pulse_auxiliary"):
        want = np.concatenate([s[name] for s in shards])
        np.testing.assert_array_equal(getattr(held, name).numpy(), want, err_msg=name)
    doms = np.cumsum([0] + [len(s["dom_sensor_id"]) for s in shards])
    want = np.concatenate([s["event_dom_offsets"][:-1] + base
                           for s, base in zip(shards, doms, strict=False)] + [doms[-1:]])
    np.testing.assert_array_equal(held.event_dom_offsets.numpy(), want)
    np.testing.assert_array_equal(held.sensor_position.numpy(), stored.positions)


def run_on_meta(loader, torch):
    """Every batch of the loader's current epoch gathered with every tensor on the meta
    device (columns, plan, output buffers): returns each batch's (name, dtype, shape)."""
    src = loader._batches
    plan = src._plan_at(loader.epoch, 0, 0)
    meta = torch.device("meta")
    held, events = src.columns.to(meta), plan.events.to(meta)
    pool = buffers.OutputPool(meta, src.layout.sections)
    shapes = []
    for b in range(plan.batches):
        batch = source.gather_batch(source._gather_for("torch", src.layout), src.layout, pool,
                                    held, events, plan, b)
        assert all(t.device.type == "meta" for t in batch.values())
        shapes.append([(k, v.dtype, tuple(v.shape)) for k, v in batch.items()])
    return shapes


@pytest.mark.parametrize("settings", [
    dict(max_pulses=900), dict(batch_events=16, layout="padded", max_doms=9, pulses_per_dom=2)])
def test_the_gather_needs_no_data_dependent_size(train_dir, torch, settings):
    # The control: what a data-dependent size looks like on the meta device.
    counts = torch.ones(4, dtype=torch.int64, device="meta")
    for data_dependent in (lambda: counts.repeat_interleave(counts), lambda: counts.nonzero(),
                           lambda: counts.sum().item(), lambda: counts[counts > 0]):
        with pytest.raises((RuntimeError, NotImplementedError)):
            data_dependent()
    loader = shardify.Loader(train_dir, device="cpu", resident=True, **settings)
    on_meta = run_on_meta(loader, torch)
    on_cpu = [[(k, v.dtype, tuple(v.shape)) for k, v in b.items()] for b in loader]
    assert on_meta == on_cpu and len(on_cpu) > 3


def test_a_held_batch_is_never_overwritten(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=4, device="cpu", resident=True)
    assert_a_held_batch_survives(loader, torch, later=74)


def test_buffers_are_reused_once_free_and_outlive_the_loader(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=2, device="cpu", resident=True)
    counts = []
    for n, batch in enumerate(loader):
        del batch
        if n in (20, 100, 149):
            counts.append(loader.staging_allocations)
    assert n == 149
    assert counts == [2, 2, 2], f"the steady state allocates: {counts}"
    # Two loops later (epochs 1 and 2), still the same two buffers.
    for _ in range(2):
        for _batch in loader:
            pass
    assert loader.staging_allocations == 2
    batch = next(iter(loader))
    charge, expected = batch["pulse_charge"], batch["pulse_charge"].clone()
    del batch, loader
    gc.collect()
    for _ in shardify.Loader(train_dir, batch_events=2, device="cpu", resident=True):
        pass
    assert torch.equal(charge, expected)


def test_state_dicts_move_between_streaming_and_resident_loaders(train_dir, torch):
    settings = dict(batch_events=10, seed=7, window_blocks=3)
    whole = epoch(shardify.Loader(train_dir, device="cpu", **settings))
    # A streaming job checkpoints after 4 batches; a resident job resumes it.
    streaming = shardify.Loader(train_dir, device="cpu", **settings)
    first = [{k: v.clone() for k, v in b.items()} for _, b in zip(range(4), streaming,
                                                                  strict=False)]
    state = streaming.state_dict()
    assert state["batches_taken"] == 4
    resident = shardify.Loader(train_dir, device="cpu", resident=True, **settings)
    resident.load_state_dict(state)
    rest = epoch(resident)
    assert_same_batches(whole, first + rest, torch)
    # ... and back: a resident state after 11 batches of epoch 1 resumes a streaming job.
    resident.set_epoch(1)
    for _, _ in zip(range(11), resident, strict=False):
        pass
    state = resident.state_dict()
    assert (state["epoch"], state["batches_taken"]) == (1, 11)
    again = shardify.Loader(train_dir, device="cpu", **settings)
    again.load_state_dict(state)
    streamed_rest = epoch(again)
    fresh = shardify.Loader(train_dir, device="cpu", resident=True, **settings)
    fresh.set_epoch(1)
    assert_same_batches(epoch(fresh)[11:], streamed_rest, torch)
    other = shardify.Loader(train_dir, device="cpu", resident=True, **dict(settings, seed=8))
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_for_loops_break_and_set_epoch_as_streaming(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=25, device="cpu", resident=True)
    assert len(loader) == 12
    first = [b["event_id"].clone() for _, b in zip(range(5), loader, strict=False)]
    rest = [b["event_id"].clone() for b in loader]  # a `for` after a break continues
    assert len(first) + len(rest) == 12 and loader.epoch == 1
    loader.set_epoch(0)
    again = [b["event_id"].clone() for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(first + rest, again, strict=True))
    ids = torch.cat(again).tolist()
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 300


def test_a_second_thread_is_refused_while_one_gathers(train_dir, torch, monkeypatch):
    import threading

    inside, release = threading.Event(), threading.Event()
    gather = source.gather_batch

    def held(*arguments):
        inside.set()
        assert release.wait(30)
        return gather(*arguments)

    loader = shardify.Loader(train_dir, batch_events=25, device="cpu", resident=True)
    monkeypatch.setattr(source, "gather_batch", held)
    first = []
    holder = threading.Thread(target=lambda: first.append(next(iter(loader))["event_id"]))
    holder.start()
    assert inside.wait(30)  # the holder is inside next(), gathering its batch
    with pytest.raises(RuntimeError, match="^another thread is using this shardify loader: "
                                           "iterate a loader from one thread at a time$"):
        next(iter(loader))
    with pytest.raises(RuntimeError, match="another thread is using"):
        loader.set_epoch(0)
    release.set()
    holder.join()
    # Neither refusal moved the position: the epoch goes on after the holder's batch.
    rest = [b["event_id"] for b in loader]
    ids = torch.cat(first + rest).tolist()
    assert len(rest) == 11 and sorted(ids) == sorted(set(ids)) and len(ids) == 300


def test_bad_settings_and_data_raise_clear_errors(train_dir, train_copy, torch, monkeypatch):
    with pytest.raises(ValueError, match="output"):
        shardify.Loader(train_dir, resident=True, output="numpy")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            shardify.Loader(train_dir, resident=True, device="cuda")
    with pytest.raises(ValueError, match="window_blocks"):
        shardify.Loader(train_dir, resident=True, device="cpu", window_blocks=0)
    manifest = shardify.Dataset(train_copy).manifest
    victim = train_copy / manifest["shards"][2]["file"]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    # Read at the first batch (not when made), and refused again at each try: a failed
    # load leaves nothing half-loaded behind.
    damaged = shardify.Loader(train_copy, resident=True, device="cpu")
    for _ in range(2):
        with pytest.raises(shardify.DatasetError, match=manifest["shards"][2]["file"]):
            next(iter(damaged))
    state = damaged.state_dict()
    assert damaged._batches._columns is None
    assert (state["epoch"], state["global_batches"]) == (0, 0), "no batch was handed out"


def test_a_dataset_that_cannot_fit_is_refused_before_allocating(train_dir, torch, monkeypatch):
    need = columns.footprint(shardify.Dataset(train_dir)).total
    allocated = []
    real_empty = torch.empty
    monkeypatch.setattr(columns, "free_bytes", lambda device: need - 1)
    monkeypatch.setattr(torch, "empty", lambda *a, **k: allocated.append(a) or real_empty(*a, **k))
    too_big = shardify.Loader(train_dir, resident=True, device="cpu")
    with pytest.raises(MemoryError) as refused:
        next(iter(too_big))
    message = str(refused.value)
    assert f"({need} bytes" in message and f"({need - 1} bytes) are free" in message, message
    assert not allocated, "the columns were allocated before the check"
    monkeypatch.setattr(columns, "free_bytes", lambda device: need)
    assert len(shardify.Loader(train_dir, resident=True, device="cpu", batch_events=300)) == 1


def test_loading_reports_progress_on_request(train_dir, torch, capsys):
    held = columns.load_columns(shardify.Dataset(train_dir), torch.device("cpu"), progress=True)
    err = capsys.readouterr().err
    assert "loading shard 4/4 into cpu" in err and err.endswith("\n")
    assert held.nbytes == columns.footprint(shardify.Dataset(train_dir)).columns
    columns.load_columns(shardify.Dataset(train_dir), torch.device("cpu"))
    assert capsys.readouterr().err == "", "quiet when stderr is not a terminal"


FUSED_CHECK = """
import sys, torch, shardify
from shardify._resident import columns
train, test = sys.argv[1], sys.argv[2]
def same(settings, path=train):
    streamed = [{k: v.clone() for k, v in b.items()}
                for b in shardify.Loader(path, device="cpu", **settings)]
    loader = shardify.Loader(path, device="cpu", resident=True, **settings)
    assert loader._batches.gather_kind == "fused"
    resident = list(loader)
    assert len(streamed) == len(resident) > 0
    for want, got in zip(streamed, resident):
        assert list(want) == list(got)
        for name in want:
            assert want[name].dtype == got[name].dtype and want[name].shape == got[name].shape
            assert torch.equal(want[name], got[name]), (settings, name)
same(dict(batch_events=24, seed=9))
same(dict(batch_events=300, window_blocks=1 << 20))        # one program walks 300 > 256 events
same(dict(max_pulses=700, max_events=30, batch_order="drawn", rank=1, world=2))
same(dict(batch_events=21, dom_positions=False))
same(dict(batch_events=16, layout="padded", max_doms=12, pulses_per_dom=3))
same(dict(batch_events=50), path=test)
columns.I64_OFFSETS_FROM = 1000
same(dict(batch_events=33, seed=1))
same(dict(batch_events=33, layout="padded", max_doms=30, pulses_per_dom=2))
print("fused gather equals the streaming loader")
"""


def test_the_fused_gather_equals_streaming(train_dir, test_dir, torch):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", SHARDIFY_RESIDENT_GATHER="fused")
    done = subprocess.run([sys.executable, "-c", FUSED_CHECK, str(train_dir), str(test_dir)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "fused gather equals the streaming loader" in done.stdout


def test_the_host_time_tool_times_each_part_of_a_batch(train_dir, torch):
    """tools/resident_host_time.py on the CPU: the whole next() and each of its parts, each
    a positive time, for the torch gather (Triton's needs a GPU)."""
    out = subprocess.run([sys.executable, str(REPO / "tools" / "resident_host_time.py"),
                          str(train_dir), "--device", "cpu", "--batches", "5"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{train_dir} on cpu; torch ")
    assert lines[1].startswith("torch: ") and "us host per batch" in lines[1]
    parts = {line[:42].strip(): float(line[42:].split()[0]) for line in lines[2:]}
    assert list(parts) == ["plan lookup", "sizes and elements", "take a buffer set", "views",
                           "slice the events", "the gather's launches"]
    assert all(t > 0 for t in parts.values()), parts


def test_every_batch_is_gathered_with_the_columns_device_current(train_dir, torch,
                                                                 monkeypatch):
    """Triton launches on the current CUDA device: each batch's gather runs inside
    launching_on(the columns' device) (tested in test_transforms), once per batch."""
    entered = []
    real_gather = source.gather_batch

    def gather(*arguments):
        entered.append("gather")
        return real_gather(*arguments)

    monkeypatch.setattr(source, "launching_on", logging_guard(entered))
    monkeypatch.setattr(source, "gather_batch", gather)
    loader = shardify.Loader(train_dir, device="cpu", resident=True, batch_events=64)
    batches = sum(1 for _ in loader)
    assert batches == 5
    assert entered == [("guard", torch.device("cpu")), "gather", "left"] * batches


def test_a_loader_made_before_its_rank_is_known_loads_the_dataset_once_for_that_rank(
        train_dir, torch, monkeypatch):
    """Lightning's DDP sets each process's rank and GPU after the script made the loader. A
    resident loader reads the dataset at its first batch, after it has found its rank and
    device again (when first used), so each process loads it once, where it serves; read
    when made, every process had first loaded a copy onto the device current then (GPU 0)."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    loads = []
    real_load = source.load_columns

    def load(dataset, device, **options):
        loads.append(device)
        return real_load(dataset, device, **options)

    monkeypatch.setattr(source, "load_columns", load)
    early = shardify.Loader(train_dir, device="cpu", resident=True, batch_events=16)
    assert (early.rank, early.world, loads) == (0, 1, [])
    stale, as_made = iter(early), weakref.ref(early._batches)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = [b["event_id"].tolist() for b in early]
    assert (early.rank, early.world) == (1, 2)
    assert_freed(as_made, "the batches as made (a copy on the device, once loaded)")
    with pytest.raises(RuntimeError, match="made again for the process's new rank"):
        next(stale)
    assert loads == [torch.device("cpu")], "loaded once, after the rank was found"
    given = shardify.Loader(train_dir, device="cpu", resident=True, batch_events=16, rank=1,
                            world=2)
    assert got == [b["event_id"].tolist() for b in given] and len(got) == len(given) > 0
