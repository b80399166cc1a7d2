"""Model-ready inputs (shardify.transforms, shardify.torch_geometric) against a per-event
NumPy reference: time order, the truncation rules at their boundaries, every feature, kNN
edges as sets per event; on generated data with the real statistics, on the real Kaggle
sample, and on hand-made batches with the edge cases."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import shardify
from conftest import logging_guard

MASK64 = (1 << 64) - 1


def mix(x: int) -> int:
    """SplitMix64's finaliser, written independently of the package."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def random_key(seed: int, epoch: int, event_id: int, rank: int) -> int:
    """The documented random key, as a signed 64-bit integer (torch sorts int64)."""
    key = mix(mix((event_id ^ mix(mix(seed) ^ epoch)) & MASK64) + rank)
    return key - (1 << 64) if key >> 63 else key


def events_of(batch) -> list[dict[str, np.ndarray]]:
    """Each event of a packed batch: its pulses in stored order, with their DOM rows."""
    b = {k: np.asarray(v) for k, v in batch.items()}
    ev, dp = b["event_dom_offsets"].astype(np.int64), b["dom_pulse_offsets"].astype(np.int64)
    out = []
    for e in range(len(b["event_id"])):
        doms = np.arange(ev[e], ev[e + 1])
        counts = dp[doms + 1] - dp[doms]
        pulses = slice(dp[ev[e]], dp[ev[e + 1]])
        out.append({"id": int(b["event_id"][e]), "time": b["pulse_time"][pulses],
                    "charge": b["pulse_charge"][pulses],
                    "aux": b["pulse_auxiliary"][pulses].astype(bool),
                    "dom": np.repeat(doms, counts), "positions": b["dom_position"]})
    return out


def reference_order(e: dict, max_pulses, keep: str, seed: int = 0, epoch: int = 0):
    """One event's output pulses (indexes into its stored pulses), per the documented rule."""
    by_time = sorted(range(len(e["time"])), key=lambda i: (e["time"][i], i))
    if max_pulses is None:
        return by_time
    rank = {p: r for r, p in enumerate(by_time)}
    if keep == "non_auxiliary_first":
        ranked = sorted(by_time, key=lambda i: (e["aux"][i], rank[i]))
    elif keep == "charge":
        ranked = sorted(by_time, key=lambda i: (-e["charge"][i], rank[i]))
    else:
        ranked = sorted(by_time, key=lambda i: (e["aux"][i],
                                                random_key(seed, epoch, e["id"], rank[i]),
                                                rank[i]))
    kept = set(ranked[:max_pulses])
    return [i for i in by_time if i in kept]


def check_time_ordered(batch, max_pulses=None, keep="non_auxiliary_first", seed=0, epoch=0):
    from shardify.transforms import time_ordered

    got = {k: np.asarray(v) for k, v in
           time_ordered(batch, max_pulses=max_pulses, keep=keep, seed=seed, epoch=epoch).items()}
    offsets = got["event_pulse_offsets"]
    assert offsets.dtype == np.int64 and offsets[0] == 0
    assert offsets[-1] == len(got["pulse_time"]) == len(got["pulse_dom"])
    np.testing.assert_array_equal(got["event_id"], np.asarray(batch["event_id"]))
    for name, section in (("pulse_time", "pulse_time"), ("pulse_charge", "pulse_charge"),
                          ("pulse_auxiliary", "pulse_auxiliary"),
                          ("pulse_position", "dom_position")):
        assert got[name].dtype == np.asarray(batch[section]).dtype, name
    for b, e in enumerate(events_of(batch)):
        want = reference_order(e, max_pulses, keep, seed, epoch)
        rows = slice(offsets[b], offsets[b + 1])
        assert offsets[b + 1] - offsets[b] == len(want), e["id"]
        np.testing.assert_array_equal(got["pulse_time"][rows], e["time"][want])
        np.testing.assert_array_equal(got["pulse_charge"][rows], e["charge"][want])
        np.testing.assert_array_equal(got["pulse_auxiliary"][rows], e["aux"][want])
        np.testing.assert_array_equal(got["pulse_dom"][rows], e["dom"][want])
        np.testing.assert_array_equal(got["pulse_position"][rows],
                                      e["positions"][e["dom"][want]])
    return got


def make_batch(torch, events, labels=True):
    """A packed batch from events given as lists of DOMs, each (sensor, [(t, q, aux), ...])."""
    ev, dp, sensor, time, charge, aux = [0], [0], [], [], [], []
    for doms in events:
        for s, pulses in doms:
            sensor.append(s)
            for t, q, a in pulses:
                time.append(t), charge.append(q), aux.append(a)
            dp.append(len(time))
        ev.append(len(sensor))
    table = np.stack([np.arange(100) * 17.0, np.arange(100) % 7 * 3.0,
                      np.arange(100) % 5 * -2.0], 1).astype(np.float32)
    batch = {
        "event_id": torch.arange(len(events), dtype=torch.int64) * 7 + 3,
        "event_dom_offsets": torch.tensor(ev, dtype=torch.int32),
        "dom_pulse_offsets": torch.tensor(dp, dtype=torch.int32),
        "dom_sensor_id": torch.tensor(sensor, dtype=torch.int16),
        "dom_position": torch.from_numpy(table[np.asarray(sensor, dtype=np.int64)]
                                         .reshape(-1, 3)),
        "pulse_time": torch.tensor(time, dtype=torch.int32),
        "pulse_charge": torch.tensor(charge, dtype=torch.float32),
        "pulse_auxiliary": torch.tensor(aux, dtype=torch.bool),
    }
    if labels:
        batch["event_azimuth"] = torch.linspace(0.1, 6.0, len(events), dtype=torch.float64)
        batch["event_zenith"] = torch.linspace(0.2, 3.0, len(events), dtype=torch.float64)
    return batch


def boundary_events(n: int):
    """Events at the truncation boundary for max_pulses=n (with ties in time across DOMs):
    exactly n, n + 1 and 0 non-auxiliary pulses, fewer than n pulses, one pulse, none."""
    def event(non_aux: int, aux: int, sensor0: int):
        pulses = [(100 + 10 * (i % 3), 1.0 + i, False) for i in range(non_aux)]
        pulses += [(95 + 10 * (i % 4), 0.5 + i, True) for i in range(aux)]
        # Spread over three DOMs, each DOM's pulses in time order as stored.
        doms = [(sensor0 + d, sorted(pulses[d::3])) for d in range(3) if pulses[d::3]]
        return doms
    return [event(n, 3, 0), event(n + 1, 2, 10), event(0, n + 4, 20), event(2, 1, 30),
            event(1, 0, 40), [], event(n + 5, 0, 50)]


@pytest.mark.parametrize("keep", ["non_auxiliary_first", "random", "charge"])
def test_truncation_at_its_boundaries(torch, keep):
    n = 5
    batch = make_batch(torch, boundary_events(n))
    got = check_time_ordered(batch, max_pulses=n, keep=keep, seed=4, epoch=2)
    counts = np.diff(got["event_pulse_offsets"]).tolist()
    assert counts == [n, n, n, 3, 1, 0, n]
    if keep == "non_auxiliary_first":
        rows = slice(*got["event_pulse_offsets"][:2])
        assert not got["pulse_auxiliary"][rows].any(), "exactly n non-auxiliary: all kept"
        rows = slice(*got["event_pulse_offsets"][2:4])
        assert got["pulse_auxiliary"][rows].all(), "no non-auxiliary pulse: auxiliary kept"
    # Without a cut every pulse, and the ties in time keep the stored order.
    check_time_ordered(batch)


def test_random_keep_is_reproducible_per_event_and_new_each_epoch(torch):
    from shardify.transforms import time_ordered

    events = [[(0, [(t, 1.0, False) for t in range(40)])] for _ in range(6)]
    batch = make_batch(torch, events)
    kept = lambda b, **kw: time_ordered(b, max_pulses=8, keep="random", **kw)  # noqa: E731
    first = kept(batch, seed=1, epoch=0)
    # The same events in another batch (reversed, fewer): the same pulses per event id.
    part = {k: v for k, v in make_batch(torch, events[:3]).items()}
    part["event_id"] = batch["event_id"][:3].flip(0)
    again = kept(part, seed=1, epoch=0)
    for b in range(3):
        mine = first["pulse_time"][8 * (2 - b):8 * (3 - b)]
        np.testing.assert_array_equal(again["pulse_time"][8 * b:8 * (b + 1)], mine)
    other_epoch = kept(batch, seed=1, epoch=1)
    other_seed = kept(batch, seed=2, epoch=0)
    assert not torch.equal(first["pulse_time"], other_epoch["pulse_time"])
    assert not torch.equal(first["pulse_time"], other_seed["pulse_time"])
    # Different events draw different pulses.
    assert not torch.equal(first["pulse_time"][:8], first["pulse_time"][8:16])


@pytest.mark.parametrize("keep", ["non_auxiliary_first", "random", "charge"])
def test_time_ordered_on_realistic_batches(realistic_dir, torch, keep):
    loader = shardify.Loader(realistic_dir, batch_events=256, seed=1)
    for i, batch in enumerate(loader):
        if i == 3:
            break
        check_time_ordered(batch)
        # A cut near the median (62 pulses) lands inside many events.
        check_time_ordered(batch, max_pulses=64, keep=keep, seed=7, epoch=loader.epoch)


def test_time_ordered_on_the_kaggle_sample(kaggle_dataset, torch):
    batch = next(iter(shardify.Loader(kaggle_dataset, batch_events=8, shuffle=False)))
    check_time_ordered(batch)
    for keep in ("non_auxiliary_first", "random", "charge"):
        check_time_ordered(batch, max_pulses=40, keep=keep)


def test_time_ordered_needs_no_host_sync_without_a_cut(torch):
    """On the meta device a data-dependent size raises: the uncut path has none."""
    from shardify.transforms import time_ordered

    batch = make_batch(torch, boundary_events(5))
    meta = {k: v.to("meta") for k, v in batch.items()}
    out = time_ordered(meta)
    assert out["pulse_time"].shape == batch["pulse_time"].shape
    assert out["pulse_position"].shape == (batch["pulse_time"].shape[0], 3)


def check_padded(pulses, length=None):
    """pad_pulses against time_ordered's CSR, event by event: each row its event's first
    ``length`` pulses in order, zeros and False after, every section in its dtype."""
    from shardify.transforms import pad_pulses

    got = {k: v.numpy() for k, v in pad_pulses(pulses, length).items()}
    csr = {k: v.numpy() for k, v in pulses.items()}
    offsets = csr["event_pulse_offsets"]
    counts = np.diff(offsets)
    width = int(counts.max(initial=0)) if length is None else length
    events = len(counts)
    assert set(got) == {k for k in csr if k != "event_pulse_offsets"} | {
        "pulse_mask", "event_pulses"}
    kept = np.minimum(counts, width)
    np.testing.assert_array_equal(got["event_pulses"], kept)
    assert got["event_pulses"].dtype == np.int64
    np.testing.assert_array_equal(got["pulse_mask"], np.arange(width) < kept[:, None])
    for name, section in csr.items():
        if name.startswith("event_") and name != "event_pulse_offsets":
            np.testing.assert_array_equal(got[name], section)
        if not name.startswith("pulse_"):
            continue
        grid = got[name]
        assert grid.dtype == section.dtype and grid.shape == (events, width,
                                                               *section.shape[1:]), name
        for b in range(events):
            rows = section[offsets[b]:offsets[b] + kept[b]]
            np.testing.assert_array_equal(grid[b, :kept[b]], rows, err_msg=f"{name} {b}")
            assert not grid[b, kept[b]:].any(), f"{name} {b}: padding is zero"
    return got


def test_pad_pulses_against_the_reference(realistic_dir, torch):
    from shardify.transforms import time_ordered

    for i, batch in enumerate(shardify.Loader(realistic_dir, batch_events=64, seed=3)):
        if i == 2:
            break
        pulses = time_ordered(batch, max_pulses=64, keep="random")
        longest = int(pulses["event_pulse_offsets"].diff().max())
        assert check_padded(pulses)["pulse_time"].shape[1] == longest == 64
        check_padded(pulses, 80)  # wider than any event
        check_padded(pulses, 17)  # narrower: each event's first 17
        check_padded(time_ordered(batch))  # uncut: the longest event of the batch
    # Hand-made edge cases: an event without pulses, one of one pulse, ties in time.
    pulses = time_ordered(make_batch(torch, boundary_events(5)))
    got = check_padded(pulses)
    assert got["event_pulses"].tolist() == [8, 8, 9, 3, 1, 0, 10]
    check_padded(pulses, 0)
    empty = time_ordered(make_batch(torch, [[]]))
    assert check_padded(empty)["pulse_time"].shape == (1, 0)


def test_pad_pulses_rounds_the_longest_event_up_to_a_multiple(torch):
    from shardify.transforms import pad_pulses, time_ordered

    pulses = time_ordered(make_batch(torch, boundary_events(5)))  # longest event: 10
    for multiple, width in ((1, 10), (4, 12), (5, 10), (16, 16)):
        got = pad_pulses(pulses, pad_to_multiple_of=multiple)
        want = pad_pulses(pulses, width)
        assert got["pulse_time"].shape == (7, width), multiple
        for name in want:
            assert torch.equal(got[name], want[name]), (multiple, name)
    empty = time_ordered(make_batch(torch, [[]]))
    assert pad_pulses(empty, pad_to_multiple_of=8)["pulse_time"].shape == (1, 0)
    for multiple in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="pad_to_multiple_of must be a positive integer"):
            pad_pulses(pulses, pad_to_multiple_of=multiple)
    with pytest.raises(ValueError, match="pad_to_multiple_of rounds the longest event's "
                                         "length up; give it with length=None"):
        pad_pulses(pulses, 16, pad_to_multiple_of=8)


def test_pad_pulses_to_a_fixed_length_needs_no_host_sync(torch):
    """On the meta device a data-dependent size raises: a fixed length reads none."""
    from shardify.transforms import pad_pulses, time_ordered

    batch = make_batch(torch, boundary_events(5))
    meta = time_ordered({k: v.to("meta") for k, v in batch.items()})
    out = pad_pulses(meta, 12)
    assert out["pulse_position"].shape == (7, 12, 3) and out["pulse_mask"].shape == (7, 12)
    with pytest.raises(Exception, match="meta"):
        pad_pulses(meta)  # the longest event is read from the data


@pytest.mark.parametrize("keep", ["non_auxiliary_first", "random", "charge"])
def test_pulse_sequences_read_nothing_at_a_fixed_length_and_the_longest_once(torch, keep,
                                                                             monkeypatch):
    """On the meta device any read of the data raises: padded to ``length`` the sequences
    read none (the kept pulses go to their cells without being counted); to the longest
    event, that alone, once."""
    import shardify.transforms as transforms

    batch = make_batch(torch, boundary_events(5))
    meta = {k: v.to("meta") for k, v in batch.items()}
    for standardize in (None, "graphnet"):
        out = transforms.pulse_sequences(meta, 12, keep=keep, standardize=standardize)
        assert out["pulse_features"].shape == (7, 12, 6) and out["pulse_mask"].shape == (7, 12)
        assert out["pulse_features"].device.type == "meta"
    with pytest.raises(Exception, match="meta"):
        transforms.pulse_sequences(meta, 12, keep=keep, padding="longest")
    reads = []

    def longest(counts):
        reads.append(counts.shape)
        return 5

    monkeypatch.setattr(transforms, "_longest", longest)
    out = transforms.pulse_sequences(meta, 12, keep=keep, padding="longest",
                                     pad_to_multiple_of=4)
    assert reads == [(7,)] and out["pulse_time"].shape == (7, 8)


def test_pad_pulses_refuses_what_is_not_time_ordered_pulses(torch):
    from shardify.transforms import pad_pulses, time_ordered

    batch = make_batch(torch, boundary_events(5))
    with pytest.raises(ValueError, match="^pad_pulses needs time_ordered's pulses with "
                                         "event_pulse_offsets"):
        pad_pulses(batch)
    with pytest.raises(TypeError, match="takes pulses: the dict of sections time_ordered"):
        pad_pulses([batch])
    pulses = time_ordered(batch)
    for length in (-1, True, 2.0):
        with pytest.raises(ValueError, match="length must be a non-negative integer"):
            pad_pulses(pulses, length)
    mixed = {**pulses, "pulse_charge": pulses["pulse_charge"][:-1]}
    with pytest.raises(ValueError, match="section pulse_charge has 38 rows where pulse_time "
                                         "has 39"):
        pad_pulses(mixed)
    # Any pulse section, not only pulse_time, which the check of the sections read covers.
    as_numpy = {**pulses, "pulse_charge": pulses["pulse_charge"].numpy()}
    with pytest.raises(TypeError, match="^pad_pulses needs torch tensors, and section "
                                        "pulse_charge is numpy.ndarray"):
        pad_pulses(as_numpy)


def reference_knn(pos: np.ndarray, offsets: np.ndarray, k: int) -> np.ndarray:
    """edge_index [2, E] as documented, event by event: float32 squared distances
    ((dx*dx + dy*dy) + dz*dz), each node's neighbours nearest first, ties to the lower row,
    no self loops, nodes in row order."""
    pairs = []
    for b in range(len(offsets) - 1):
        rows = np.arange(offsets[b], offsets[b + 1])
        p = pos[rows].astype(np.float32)
        for i in range(len(rows)):
            d = p[:, 0] - p[i, 0]
            dist = d * d
            d = p[:, 1] - p[i, 1]
            dist = dist + d * d
            d = p[:, 2] - p[i, 2]
            dist = dist + d * d
            order = [j for j in np.lexsort((np.arange(len(rows)), dist)) if j != i][:k]
            pairs += [(int(rows[j]), int(rows[i])) for j in order]
    return np.array(pairs, dtype=np.int64).reshape(-1, 2).T


def position_groups(pos: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A group id per node: one per distinct position of an event, ascending event by
    event (what a batch's ``pulse_dom`` is)."""
    groups, first = [], 0
    for b in range(len(offsets) - 1):
        _, inverse = np.unique(pos[offsets[b]:offsets[b + 1]], axis=0, return_inverse=True)
        groups.append(inverse.reshape(-1) + first)
        first += int(inverse.max()) + 1 if len(inverse) else 0
    return np.concatenate(groups).astype(np.int64)


def test_knn_edges_against_the_reference(realistic_dir, torch):
    from shardify.transforms import knn_edges, time_ordered

    batch = next(iter(shardify.Loader(realistic_dir, batch_events=64, seed=2)))
    pulses = time_ordered(batch, max_pulses=300)
    pos, offsets = pulses["pulse_position"], pulses["event_pulse_offsets"]
    for k in (1, 8):
        edge_index = knn_edges(pos, offsets, k)
        got = edge_index.numpy()
        assert got.shape[0] == 2 and got.dtype == np.int64
        counts = np.diff(offsets.numpy())
        assert got.shape[1] == sum(c * min(k, c - 1) for c in counts if c > 1)
        assert (got[0] != got[1]).all(), "no self loops"
        assert (np.diff(got[1]) >= 0).all(), "sorted by node"
        want = reference_knn(pos.numpy(), offsets.numpy(), k)
        np.testing.assert_array_equal(got, want)
        # The same graph from distances once per DOM.
        by_dom = knn_edges(pos, offsets, k, groups=pulses["pulse_dom"])
        np.testing.assert_array_equal(by_dom.numpy(), want)


@pytest.mark.parametrize("at_once", [True, False])
def test_knn_distances_at_once_or_axis_by_axis_give_the_reference(realistic_dir, torch,
                                                                  monkeypatch, at_once):
    """The GPU's form (all three axes per operation) and the CPU's (axis by axis), each run
    here on the CPU: the reference's edges, per pulse and per DOM, in chunks of queries."""
    import shardify.transforms as transforms

    chosen = []
    monkeypatch.setattr(transforms, "_distances_at_once",
                        lambda device: chosen.append(device.type) or at_once)
    monkeypatch.setattr(transforms, "_KNN_BLOCK_ELEMENTS", 1 << 12)  # several chunks
    passes = 0
    for _ in knn_against_the_reference(realistic_dir, events=48, seed=8, max_pulses=200):
        assert chosen and set(chosen) == {"cpu"}
        chosen.clear()
        passes += 1
    assert passes == 2


def knn_against_the_reference(realistic_dir, events, seed, max_pulses):
    """Checks knn_edges (k=8) per pulse, then per DOM, against the reference on a
    realistic batch cut to ``max_pulses``; yields each pass's node offsets after its check
    (for the caller's own)."""
    import shardify.transforms as transforms

    batch = next(iter(shardify.Loader(realistic_dir, batch_events=events, seed=seed)))
    pulses = transforms.time_ordered(batch, max_pulses=max_pulses)
    pos, offsets = pulses["pulse_position"], pulses["event_pulse_offsets"]
    want = reference_knn(pos.numpy(), offsets.numpy(), 8)
    for groups in (None, pulses["pulse_dom"]):
        got = transforms.knn_edges(pos, offsets, 8, groups=groups)
        np.testing.assert_array_equal(got.numpy(), want)
        yield offsets


FUSED_KNN = """
import sys

import numpy as np
import shardify
import shardify._knn_fused as fused
import torch
from shardify.transforms import knn_edges, time_ordered

calls = []
real = fused.knn_edges_fused
fused.knn_edges_fused = lambda *a: calls.append(a[3]) or real(*a)
batch = next(iter(shardify.Loader(sys.argv[1], batch_events=48, seed=5)))
cases = {}
for name, max_pulses, k in (("cut256", 256, 8), ("cut256-k1", 256, 1), ("cut40", 40, 8),
                            ("uncut", None, 8)):
    pulses = time_ordered(batch, max_pulses=max_pulses)
    cases[name] = (pulses["pulse_position"], pulses["event_pulse_offsets"], k)
# Hand-made: empty and one-node events, an event of exactly 256 nodes, fewer nodes than k,
# and many nodes sharing a position (ties broken by row).
rng = np.random.default_rng(7)
counts = [0, 1, 2, 3, 0, 256, 5, 1, 17, 9]
offsets = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32)
pos = rng.integers(0, 4, size=(sum(counts), 3)).astype(np.float32) * 10
cases["hand"] = (torch.from_numpy(pos), offsets, 12)
out = {}
for name, (pos, offsets, k) in cases.items():
    before = len(calls)
    out[name + "-edges"] = knn_edges(pos, offsets, k).numpy()
    out[name + "-pos"], out[name + "-offsets"] = pos.numpy(), offsets.numpy()
    out[name + "-k"] = np.array(k)
    out[name + "-kernel"] = np.array(len(calls) - before)
np.savez(sys.argv[2], **out)
"""


def test_the_fused_knn_kernel_gives_the_reference(realistic_dir, torch, tmp_path):
    """SHARDIFY_KNN=fused, the kernel run on CPU tensors by Triton's interpreter: the
    reference's edges (k = 1, 8, 12) on batches cut to 256 and 40 pulses and on hand-made
    events (empty, one node, fewer nodes than k, exactly 256 nodes, shared positions); an
    uncut batch, whose largest event exceeds the kernel's 256 nodes, takes the torch path."""
    from shardify.transforms import knn_edges

    pytest.importorskip("triton")
    saved = tmp_path / "edges.npz"
    env = dict(os.environ, TRITON_INTERPRET="1", SHARDIFY_KNN="fused")
    done = subprocess.run([sys.executable, "-c", FUSED_KNN, str(realistic_dir), str(saved)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    got = np.load(saved)
    for name in ("cut256", "cut256-k1", "cut40", "hand", "uncut"):
        pos, offsets, k = got[name + "-pos"], got[name + "-offsets"], int(got[name + "-k"])
        largest = int(np.diff(offsets).max())
        assert int(got[name + "-kernel"]) == (largest <= 256), (name, largest)
        if name == "uncut":
            assert largest > 256, "the uncut batch has an event too large for the kernel"
            want = knn_edges(torch.from_numpy(pos), torch.from_numpy(offsets), k).numpy()
        else:
            want = reference_knn(pos, offsets, k)
        np.testing.assert_array_equal(got[name + "-edges"], want, err_msg=name)


@pytest.mark.parametrize("block_cost", [0, 1 << 40])
def test_knn_edges_do_not_depend_on_how_events_share_blocks(realistic_dir, torch, monkeypatch,
                                                            block_cost):
    """One block per size class (no padding across sizes), or every class padded into as
    few blocks as a small budget allows: the same edges as the reference."""
    import shardify.transforms as transforms

    blocks = []
    real_block = transforms._knn_block
    monkeypatch.setattr(transforms, "_knn_block",
                        lambda *a: blocks.append(a[3]) or real_block(*a))
    monkeypatch.setattr(transforms, "_KNN_BLOCK_COST_PAIRS", block_cost)
    monkeypatch.setattr(transforms, "_KNN_BLOCK_ELEMENTS", 1 << 16)
    for offsets in knn_against_the_reference(realistic_dir, events=64, seed=3, max_pulses=300):
        counts = np.diff(offsets.numpy())
        assert sum(b.starts.shape[0] for b in blocks) == (counts > 1).sum()
        # Every block fits the budget; with no cost per block each holds one size class.
        for b in blocks:
            assert b.starts.shape[0] * b.size * b.size <= max(1 << 16, b.size * b.size)
            sizes = {transforms._padded_size(int(n)) for n in b.counts}
            assert max(sizes) == b.size
            if block_cost == 0:
                assert sizes == {b.size}
        if block_cost:
            assert any(len({transforms._padded_size(int(n)) for n in b.counts}) > 1
                       for b in blocks), "some block pads smaller events"
        blocks.clear()


def group_cost(sizes, widths, first, end, budget, block_cost):
    """The documented cost of computing events [first, end) padded to one size."""
    per_block = max(1, budget // sizes[first] ** 2)
    blocks = -(-(end - first) // per_block)
    return blocks * block_cost + (end - first) * sizes[first] * max(widths[first:end])


@pytest.mark.parametrize("seed", range(6))
def test_block_groups_are_the_cheapest_runs_of_size_classes(seed):
    """Against every partition of the size classes into runs, on random batches."""
    from itertools import combinations

    from shardify.transforms import _group_classes, _padded_size, _plan_blocks

    gen = np.random.default_rng(seed)
    counts = gen.choice([2, 3, 9, 14, 30, 40, 70, 130, 256], size=int(gen.integers(1, 40)))
    sizes = sorted((_padded_size(int(n)) for n in counts), reverse=True)
    widths = [int(gen.integers(1, s + 1)) for s in sizes]
    budget, block_cost = int(gen.choice([1 << 12, 1 << 16])), int(gen.choice([0, 500, 40000]))
    starts = [i for i in range(len(sizes)) if i == 0 or sizes[i] != sizes[i - 1]]
    best = None
    for r in range(len(starts)):
        for cuts in combinations(starts[1:], r):
            bounds = [0, *cuts, len(sizes)]
            cost = sum(group_cost(sizes, widths, a, b, budget, block_cost)
                       for a, b in zip(bounds[:-1], bounds[1:], strict=True))
            best = cost if best is None else min(best, cost)
    groups = _group_classes(sizes, widths, budget, block_cost)
    assert [g[0] for g in groups][0] == 0 and groups[-1][1] == len(sizes)
    assert all(a[1] == b[0] and b[0] in starts for a, b in zip(groups[:-1], groups[1:],
                                                                  strict=True))
    assert sum(group_cost(sizes, widths, a, b, budget, block_cost) for a, b in groups) == best
    blocks = _plan_blocks(sizes, widths, budget, block_cost)
    assert [i for b in blocks for i in range(*b)] == list(range(len(sizes)))
    assert all(b - a <= max(1, budget // sizes[a] ** 2) for a, b in blocks)
    assert {a for a, _ in groups} <= {a for a, _ in blocks}


def test_knn_handles_a_heavy_event_in_bounded_blocks(torch, monkeypatch):
    """An event far larger than one distance block is split into row chunks, and agrees
    with the reference on every node."""
    import shardify.transforms as transforms

    monkeypatch.setattr(transforms, "_KNN_BLOCK_ELEMENTS", 4096)
    gen = np.random.default_rng(0)
    sizes = [700, 1, 0, 9, 130]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    # Positions on a coarse grid: many exact ties, as pulses of one DOM have.
    pos = gen.integers(0, 6, size=(offsets[-1], 3)).astype(np.float32) * 17
    want = reference_knn(pos, offsets, 4)
    got = transforms.knn_edges(torch.from_numpy(pos), torch.from_numpy(offsets), 4).numpy()
    np.testing.assert_array_equal(got, want)
    groups = position_groups(pos, offsets)
    assert len(np.unique(groups)) < len(pos) / 2, "the grid makes groups of many nodes"
    got = transforms.knn_edges(torch.from_numpy(pos), torch.from_numpy(offsets), 4,
                               groups=torch.from_numpy(groups)).numpy()
    np.testing.assert_array_equal(got, want)


def test_knn_refuses_groups_that_break_their_contract(torch):
    from shardify.transforms import knn_edges

    pos = torch.tensor([[0.0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0]])
    offsets = torch.tensor([0, 2, 4])
    fine = knn_edges(pos, offsets, 1, groups=torch.tensor([0, 0, 1, 1]))
    assert fine.tolist() == [[1, 0, 3, 2], [0, 1, 2, 3]]
    one_place = torch.zeros(4, 3)
    for where, groups, why in [(one_place, [0, 1, 1, 2], "one id in two events"),
                               (pos, [0, 0, 0, 1], "one id at two positions"),
                               (pos, [1, 1, 0, 0], "ids descending")]:
        with pytest.raises(ValueError, match="groups must give each id's nodes one event"):
            knn_edges(where, offsets, 1, groups=torch.tensor(groups))
            pytest.fail(why)
    with pytest.raises(ValueError, match=r"one id per node \(4\)"):
        knn_edges(pos, offsets, 1, groups=torch.tensor([0, 0, 1]))


def test_knn_refuses_offsets_and_positions_that_do_not_fit(torch):
    """Offsets that do not cover pos's rows from 0, in order, are a ValueError naming them
    (they were torch's "allocated size does not match" or "repeats can not be negative")."""
    from shardify.transforms import knn_edges

    pos = torch.rand(5, 3)
    for offsets in ([0, 6], [0, 4], [1, 5], [0, 3, 2, 5], [], [[0, 5]]):
        with pytest.raises(ValueError, match=r"knn_edges: offsets must"):
            knn_edges(pos, torch.tensor(offsets, dtype=torch.int64), 2)
            pytest.fail(str(offsets))
    with pytest.raises(ValueError, match=r"end at the node count \(5, the rows of pos\); "
                                         r"they are \[0 3 2 5\]"):
        knn_edges(pos, torch.tensor([0, 3, 2, 5]), 2)
    with pytest.raises(ValueError, match=r"pos must be \[N, 3\] .* not shape \(5, 2\)"):
        knn_edges(torch.rand(5, 2), torch.tensor([0, 5]), 2)
    with pytest.raises(TypeError, match="offsets must be a torch tensor, not numpy.ndarray"):
        knn_edges(pos, np.array([0, 5]), 2)
    assert knn_edges(pos, torch.tensor([0, 2, 2, 5]), 1).shape == (2, 5), "an empty event"


def test_knn_refuses_an_unknown_method(torch, monkeypatch):
    """SHARDIFY_KNN names torch or fused; anything else is an error naming the variable, and
    an empty value is the default (torch)."""
    from shardify.transforms import knn_edges

    pos, offsets = torch.tensor([[0.0, 0, 0], [1, 0, 0]]), torch.tensor([0, 2])
    monkeypatch.setenv("SHARDIFY_KNN", "")
    assert knn_edges(pos, offsets, 1).tolist() == [[1, 0], [0, 1]]
    monkeypatch.setenv("SHARDIFY_KNN", "Fused")
    with pytest.raises(ValueError, match=r"invalid SHARDIFY_KNN: 'Fused' \(expected torch or"):
        knn_edges(pos, offsets, 1)


@pytest.mark.parametrize(
    ("device", "installed", "capability", "hip", "want"),
    [("cpu", True, None, None, "torch"),                 # Triton only interprets there
     ("cuda:0", True, (9, 0), None, "fused"),            # an H100 / H200
     ("cuda:1", True, (7, 0), None, "fused"),            # torch's compiler's own floor
     ("cuda:0", True, (6, 1), None, "torch"),            # a Pascal card: Triton cannot build
     ("cuda:0", False, (9, 0), None, "torch"),           # no triton package
     ("cuda:0", True, (0, 0), "6.2", "fused")])          # a ROCm build of torch
def test_the_triton_kernels_are_the_default_where_triton_serves_the_device(
        torch, monkeypatch, device, installed, capability, hip, want):
    """SHARDIFY_KNN and SHARDIFY_RESIDENT_GATHER unset: the Triton kernel on a GPU Triton
    builds for (torch's rule for its compiler), torch operations elsewhere; set, they
    choose, whatever the device; and to_pyg computes distances per DOM exactly where the
    torch path runs on the CPU."""
    from shardify import _kernels
    from shardify._resident.source import choose_gather
    from shardify.torch_geometric import distances_per_dom
    from shardify.transforms import choose_knn

    asked = []

    def capability_of(index):
        asked.append(index)
        return capability

    monkeypatch.setattr(_kernels, "_triton_installed", lambda: installed)
    monkeypatch.setattr(_kernels, "_capability", capability_of)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.delenv("SHARDIFY_KNN", raising=False)
    monkeypatch.delenv("SHARDIFY_RESIDENT_GATHER", raising=False)
    where = torch.device(device)
    assert choose_knn(where) == want and choose_gather(where) == want
    if where.type == "cpu" or not installed or hip:
        assert asked == [], "the capability is read only for an NVIDIA GPU with Triton"
    else:
        assert asked == [where.index] * 2, asked
    assert distances_per_dom(where, 256) == (where.type == "cpu")
    assert distances_per_dom(where, 257) and distances_per_dom(where, None)
    for chosen in ("torch", "fused"):
        monkeypatch.setenv("SHARDIFY_KNN", chosen)
        monkeypatch.setenv("SHARDIFY_RESIDENT_GATHER", chosen)
        assert choose_knn(where) == chosen and choose_gather(where) == chosen
    assert distances_per_dom(torch.device("cpu"), 256) is False, "fused on the CPU: per pulse"
    monkeypatch.setenv("SHARDIFY_RESIDENT_GATHER", "triton")
    with pytest.raises(ValueError, match=r"invalid SHARDIFY_RESIDENT_GATHER: 'triton' "
                                         r"\(expected torch or fused\)"):
        choose_gather(where)


def test_triton_launches_make_their_tensors_gpu_current(torch, monkeypatch):
    """Triton launches on the current CUDA device whatever its arguments' device: a job on
    cuda:1 that never called set_device(1) would launch the kNN kernel on GPU 0 with GPU 1's
    pointers. The launch is made with the tensors' GPU current (only where it is another),
    and knn_edges launches its kernel inside that guard."""
    from shardify import _kernels, _knn_fused, transforms

    made_current = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", logging_guard(made_current))
    for device in ("cuda:1", "cuda:0", "cpu"):
        with _kernels.launching_on(torch.device(device)):
            made_current.append(f"launch {device}")
    assert made_current == [("guard", torch.device("cuda:1")), "launch cuda:1", "left",
                            "launch cuda:0", "launch cpu"]

    guarded = []
    monkeypatch.setattr(transforms, "launching_on", logging_guard(guarded))
    monkeypatch.setattr(_knn_fused, "knn_edges_fused",
                        lambda *arguments: guarded.append("kernel"))
    monkeypatch.setenv("SHARDIFY_KNN", "fused")
    transforms.knn_edges(torch.rand(5, 3), torch.tensor([0, 2, 5]), 2)
    assert guarded == [("guard", torch.device("cpu")), "kernel", "left"]


def test_torch_compile_calls_the_transforms_rather_than_tracing_them(torch):
    """A model that calls knn_edges (DynEdge's EdgeConv blocks do), compiled: the call is
    one graph break and the graphs around it compile once more for dynamic sizes, where
    traced, the sizes it reads on the host compiled its pieces again for each batch's
    (Dynamo's tracing alone, no code generated, on batches of 20 to 90 nodes)."""
    import inspect

    import torch._dynamo
    from shardify.torch_geometric import to_pyg
    from shardify.transforms import (
        knn_edges,
        pad_pulses,
        pulse_features,
        pulse_sequences,
        time_ordered,
    )

    def graphs_compiled(knn):
        torch._dynamo.reset()
        counters = torch._dynamo.utils.counters
        counters.clear()

        def model(pos, offsets):
            edges = knn(pos * 2.0, offsets, 4)
            return pos.sum() + edges.sum()

        compiled = torch.compile(model, backend="eager")
        generator = torch.Generator().manual_seed(0)
        for n in (20, 33, 47, 64, 81, 90):
            pos = torch.rand(n, 3, generator=generator)
            offsets = torch.tensor([0, n // 3, n])
            assert torch.equal(compiled(pos, offsets), model(pos, offsets))
        return counters["stats"]["unique_graphs"]

    untraced, traced = graphs_compiled(knn_edges), graphs_compiled(inspect.unwrap(knn_edges))
    assert untraced <= 4, untraced
    assert traced > 3 * untraced, f"traced, {traced} graphs: the batches did not vary"
    for function in (knn_edges, time_ordered, pad_pulses, pulse_features, pulse_sequences,
                     to_pyg):
        assert inspect.unwrap(function) is not function, function.__name__
    torch._dynamo.reset()


def check_features(x: np.ndarray, pulses: dict[str, np.ndarray], standardize) -> None:
    """``x`` [P, 6] float32: x, y, z, time, charge, auxiliary of time_ordered's ``pulses``
    (NumPy arrays), scaled as ``standardize`` says, computed here in float32."""
    assert x.dtype == np.float32 and x.shape == (len(pulses["pulse_time"]), 6)
    xyz = pulses["pulse_position"].astype(np.float32)
    t = pulses["pulse_time"].astype(np.float32)
    q = pulses["pulse_charge"].astype(np.float32)
    a = pulses["pulse_auxiliary"].astype(np.float32)
    if standardize == "graphnet":
        # graphnet-team/graphnet, src/graphnet/models/detector/icecube.py, IceCubeKaggle.
        xyz, t, q = xyz / np.float32(500.0), (t - np.float32(1e4)) / np.float32(3e4), \
            np.log10(q) / np.float32(3.0)
    for column, want in enumerate([xyz[:, 0], xyz[:, 1], xyz[:, 2], t, q, a]):
        np.testing.assert_allclose(x[:, column], want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("standardize", [None, "graphnet"])
def test_pulse_features_against_the_reference_and_padded(realistic_dir, torch, standardize):
    """Every column of every pulse, cut and uncut; as a section, pad_pulses pads it with the
    rest ([B, L, 6]); no host synchronisation (it runs on the meta device)."""
    from shardify.transforms import PULSE_FEATURES, pulse_features, time_ordered

    assert PULSE_FEATURES == ("x", "y", "z", "time", "charge", "auxiliary")
    for i, batch in enumerate(shardify.Loader(realistic_dir, batch_events=64, seed=4)):
        if i == 2:
            break
        for cut in (None, 48):
            pulses = time_ordered(batch, max_pulses=cut, keep="charge")
            features = pulse_features(pulses, standardize=standardize)
            check_features(features.numpy(), {k: v.numpy() for k, v in pulses.items()},
                           standardize)
            pulses["pulse_features"] = features
            assert check_padded(pulses, 40)["pulse_features"].shape == (64, 40, 6)
    edge = time_ordered(make_batch(torch, boundary_events(5)))
    assert pulse_features(edge, standardize).shape == (edge["pulse_time"].shape[0], 6)
    meta = time_ordered({k: v.to("meta") for k, v in make_batch(
        torch, boundary_events(5)).items()})
    assert pulse_features(meta, standardize).shape == (meta["pulse_time"].shape[0], 6)


def test_pulse_features_refuses_what_is_not_time_ordered_pulses(torch):
    from shardify.transforms import pulse_features, time_ordered

    batch = make_batch(torch, boundary_events(5))
    with pytest.raises(ValueError, match="^pulse_features needs time_ordered's pulses with "
                                         "pulse_position"):
        pulse_features(batch)
    pulses = time_ordered(batch)
    with pytest.raises(ValueError, match="invalid standardize: 'zscore'"):
        pulse_features(pulses, "zscore")
    with pytest.raises(TypeError, match="^pulse_features needs torch tensors, and section "
                                        "pulse_charge is numpy.ndarray"):
        pulse_features({**pulses, "pulse_charge": pulses["pulse_charge"].numpy()})
    with pytest.raises(ValueError, match=r"pulse_position must be \[P, 3\] and pulse_time, "
                                         r"pulse_charge, pulse_auxiliary \[P\], not \(39, 3\), "
                                         r"\(39,\), \(38,\), \(39,\)"):
        pulse_features({**pulses, "pulse_charge": pulses["pulse_charge"][:-1]})


@pytest.mark.parametrize("standardize", [None, "graphnet"])
def test_to_pyg_pulses_graphnet_features_labels_and_edges(realistic_dir, torch, standardize):
    pyg = pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    from shardify.torch_geometric import to_pyg
    from shardify.transforms import time_ordered

    batch = next(iter(shardify.Loader(realistic_dir, batch_events=32, seed=5)))
    graphs = to_pyg(batch, standardize=standardize, knn=8, max_pulses=128)
    assert isinstance(graphs, pyg.data.Batch) and graphs.num_graphs == 32
    pulses = {k: v.numpy() for k, v in time_ordered(batch, max_pulses=128).items()}
    check_features(graphs.x.numpy(), pulses, standardize)
    np.testing.assert_array_equal(graphs.ptr.numpy(), pulses["event_pulse_offsets"])
    np.testing.assert_array_equal(graphs.n_pulses.numpy(),
                                  np.diff(pulses["event_pulse_offsets"]).astype(np.float32))
    np.testing.assert_array_equal(
        graphs.batch.numpy(), np.repeat(np.arange(32), np.diff(pulses["event_pulse_offsets"])))
    az, zen = batch["event_azimuth"].numpy(), batch["event_zenith"].numpy()
    np.testing.assert_allclose(graphs.direction.numpy(), np.stack(
        [np.cos(az) * np.sin(zen), np.sin(az) * np.sin(zen), np.cos(zen)], 1), rtol=1e-12)
    want = reference_knn(pulses["pulse_position"], pulses["event_pulse_offsets"], 8)
    np.testing.assert_array_equal(graphs.edge_index.numpy(), want)


@pytest.mark.parametrize("per_dom", [True, False])
def test_to_pyg_edges_are_the_same_per_pulse_and_per_dom(realistic_dir, torch, monkeypatch,
                                                        per_dom):
    """to_pyg computes kNN distances per DOM or (on a GPU, short cut events) per pulse: each
    way, the reference's edges; and the rule picks per pulse only there."""
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    import shardify.torch_geometric as tg
    from shardify.transforms import time_ordered

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert not tg.distances_per_dom(cuda, 256) and not tg.distances_per_dom(cuda, 1)
    assert tg.distances_per_dom(cuda, 257) and tg.distances_per_dom(cuda, None)
    assert tg.distances_per_dom(cpu, 256) and tg.distances_per_dom(cpu, None)
    chosen = []

    def rule(device, max_pulses):
        chosen.append((device.type, max_pulses))
        return per_dom

    monkeypatch.setattr(tg, "distances_per_dom", rule)
    calls = []
    real = tg.knn_edges

    def knn_edges(*args, **kwargs):
        calls.append("groups" in kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(tg, "knn_edges", knn_edges)
    batch = next(iter(shardify.Loader(realistic_dir, batch_events=32, seed=6)))
    graphs = tg.to_pyg(batch, standardize="graphnet", knn=8, max_pulses=64)
    assert chosen == [("cpu", 64)] and calls == [per_dom]
    pulses = {k: v.numpy() for k, v in time_ordered(batch, max_pulses=64).items()}
    want = reference_knn(pulses["pulse_position"], pulses["event_pulse_offsets"], 8)
    np.testing.assert_array_equal(graphs.edge_index.numpy(), want)


def test_to_pyg_keeps_tiny_events_unless_asked(torch):
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    from shardify.torch_geometric import to_pyg

    batch = make_batch(torch, boundary_events(3))
    graphs = to_pyg(batch, knn=8)
    assert graphs.num_graphs == 7
    assert graphs.n_pulses.tolist() == [6, 6, 7, 3, 1, 0, 8]
    np.testing.assert_array_equal(graphs.event_id.numpy(), batch["event_id"].numpy())
    dropped = to_pyg(batch, knn=8, min_pulses=2)
    assert dropped.num_graphs == 5 and dropped.n_pulses.tolist() == [6, 6, 7, 3, 8]
    keep = [0, 1, 2, 3, 6]
    np.testing.assert_array_equal(dropped.event_id.numpy(), batch["event_id"].numpy()[keep])
    np.testing.assert_array_equal(dropped.direction.numpy(), graphs.direction.numpy()[keep])
    assert dropped.x.shape[0] == 30 and dropped.batch.max().item() == 4
    np.testing.assert_array_equal(dropped.x.numpy(), np.concatenate(
        [graphs.x.numpy()[graphs.ptr[g]:graphs.ptr[g + 1]] for g in keep]))
    np.testing.assert_array_equal(dropped.edge_index.numpy(),
                                  reference_knn(dropped.pos.numpy(), dropped.ptr.numpy(), 8))


def test_adapters_refuse_what_they_cannot_do(train_dir, torch):
    from shardify.torch_geometric import to_pyg
    from shardify.transforms import knn_edges, time_ordered

    padded = next(iter(shardify.Loader(train_dir, batch_events=8, layout="padded",
                                           max_doms=8, pulses_per_dom=2)))
    with pytest.raises(ValueError, match="packed batch with event_dom_offsets"):
        time_ordered(padded)
    batch = next(iter(shardify.Loader(train_dir, batch_events=8)))
    with pytest.raises(ValueError, match="invalid keep: 'loudest'"):
        time_ordered(batch, max_pulses=4, keep="loudest")
    with pytest.raises(ValueError, match="max_pulses must be a positive integer"):
        time_ordered(batch, max_pulses=0)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        knn_edges(batch["dom_position"], batch["event_dom_offsets"], 0)
    with pytest.raises(ValueError, match="invalid standardize"):
        to_pyg(batch, standardize="icecube")
    # to_pyg names itself, not the time_ordered it calls, for either kind of node.
    for nodes in ("pulses", "doms"):
        with pytest.raises(ValueError, match="^to_pyg needs a packed batch with event_dom"):
            to_pyg(padded, nodes)
    with pytest.raises(ValueError, match="min_pulses must be a non-negative integer, not -1"):
        to_pyg(batch, min_pulses=-1)
    with pytest.raises(ValueError, match="min_pulses must be a non-negative integer, not 2.0"):
        to_pyg(batch, min_pulses=2.0)
    for adapter in (time_ordered, to_pyg):
        with pytest.raises(TypeError, match="takes a batch: the dict of sections a "
                                            "shardify.Loader yields, not builtins.list"):
            adapter(list(batch.values()))
    arrays = next(iter(shardify.Loader(train_dir, batch_events=8, output="numpy")))
    for adapter in (time_ordered, to_pyg):
        with pytest.raises(TypeError, match="needs torch tensors, and section event_id is "
                                            "numpy.ndarray: make the loader with output="):
            adapter(arrays)
    wrapped = {name: torch.from_numpy(array) for name, array in arrays.items()}
    assert time_ordered(wrapped)["pulse_time"].shape == arrays["pulse_time"].shape

