"""Zero copy: tensors view the batch buffer, keep it alive, and the pool stops growing."""

import gc

import numpy as np
import pytest
import shardify
from conftest import assert_a_held_batch_survives, span


def test_sections_of_a_batch_share_one_buffer(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=16, device="cpu")
    batch = next(iter(loader))
    spans = sorted(span(t) for t in batch.values())
    # One buffer cut into 64-byte aligned sections, in order, without overlap.
    assert all(s % 64 == 0 for s, _ in spans)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] - spans[0][0] < 1 << 22, "one buffer, not scattered allocations"
    # Writing through one tensor is visible through a numpy view of the same memory.
    times = batch["pulse_time"]
    view = np.from_dlpack(times)
    times[0] = 12345
    assert view[0] == 12345


def test_a_held_batch_is_never_overwritten(train_dir, torch):
    # 74 more batches through a pool of a dozen buffers.
    loader = shardify.Loader(train_dir, batch_events=4, device="cpu", prefetch=2, workers=2)
    assert_a_held_batch_survives(loader, torch, later=74)


def test_a_tensor_outlives_its_loader(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=16, device="cpu")
    batch = next(iter(loader))
    charge, expected = batch["pulse_charge"], batch["pulse_charge"].clone()
    del batch, loader
    gc.collect()
    # Another loader runs (and allocates) meanwhile; the kept tensor is unchanged.
    for _ in shardify.Loader(train_dir, batch_events=16, device="cpu"):
        pass
    assert torch.equal(charge, expected)
    assert float(charge.sum()) == float(expected.sum())


@pytest.mark.parametrize("aside", [1, 3])
def test_batches_kept_aside_cost_no_allocation_per_batch(train_dir, torch, aside):
    """A loop that keeps batches for good (a sample to log) and holds the previous batch
    while it takes the next (``for batch in loader``) holds more than the pool's slack at
    every new batch: the pool adds buffers for that once, not one per batch."""
    loader = shardify.Loader(train_dir, batch_events=2, device="cpu")
    batches = iter(loader)
    kept = [next(batches) for _ in range(aside)]
    counts = []
    # The loop variable holds the previous batch while the next is taken.
    for n, _batch in enumerate(batches):
        if n in (20, 100, 140):
            counts.append(loader.staging_allocations)
    assert n == 149 - aside
    assert counts[0] == counts[1] == counts[2], f"the pool allocated per batch: {counts}"
    assert all(int(k["event_id"][0]) >= 0 for k in kept)


def test_steady_state_allocates_no_buffers(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=2, device="cpu")
    counts = []
    for n, batch in enumerate(loader):
        del batch
        if n in (20, 100, 149):
            counts.append(loader.staging_allocations)
    assert n == 149
    assert counts[0] > 0
    assert counts[0] == counts[1] == counts[2], f"the pool grew: {counts}"
