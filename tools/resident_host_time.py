#!/usr/bin/env python3
"""Where a resident loader's host time per batch goes, on a GPU (or the CPU).

    python tools/resident_host_time.py DATASET [--device cuda:0] [--batches 400]

A resident loader's batches are gathered by kernels the training thread launches; the GPU
runs them asynchronously, so the loader's cost to the step is its host time per batch. For
each gather (``fused``: the Triton kernels, where Triton imports; ``torch``: the torch
operations) it prints the host time per batch of the whole ``next()``, then of its parts
(the plan lookup, taking a buffer set, slicing the views, the gather's launches), and the
events/s with the device synchronised once at the end (the GPU's pace where it is the
slower). Medians over ``--batches`` batches after as many again of warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import shardify
import torch


def per_call(work: Callable[[], Any], repeat: int) -> float:
    """Median host seconds of ``work`` over ``repeat`` calls (no synchronisation)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile(dataset: str, device: torch.device, gather: str, batches: int) -> None:
    os.environ["SHARDIFY_RESIDENT_GATHER"] = gather
    loader = shardify.Loader(dataset, resident=True, device=str(device), seed=0)
    source = loader._batches
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def next_batch() -> Any:
        batch = source.next()
        if batch is None:  # the epoch's end: start the next one
            batch = source.next()
        return batch

    for _ in range(batches):
        next_batch()
    sync()
    whole = per_call(next_batch, batches)
    sync()
    started = time.perf_counter()
    events = 0
    for _ in range(batches):
        events += next_batch()["event_id"].shape[0]
    sync()
    pace = events / (time.perf_counter() - started)

    # The parts of one next(), on the batch the source is at.
    epoch, origin, taken = source.position()
    plan = source._plan_at(epoch, origin, taken)
    b = min(taken - plan.first, plan.batches - 1)
    layout, pool, columns = source.layout, source.pool, source.columns
    n = plan.sizes(b, layout)
    elements = layout.elements(n)
    events_slice = plan.events[plan.starts[b]:plan.starts[b + 1]]
    parts = {
        "plan lookup": lambda: source._plan_at(epoch, origin, taken),
        "sizes and elements": lambda: layout.elements(plan.sizes(b, layout)),
        "take a buffer set": lambda: pool.take(elements, plan.capacity),
        "views": lambda: layout.views(pool.take(elements, plan.capacity), n, elements),
        "slice the events": lambda: plan.events[plan.starts[b]:plan.starts[b + 1]],
    }
    _, written = layout.views(pool.take(elements, plan.capacity), n, elements)
    parts["the gather's launches"] = lambda: source._gather(columns, events_slice, n, written)
    if gather == "fused":
        from shardify._resident import fused

        parts["  the event walk alone (one launch)"] = lambda: fused._walk_events(
            columns, events_slice, n, written, offsets=True)
    print(f"{gather}: {per_call(lambda: None, batches) * 1e6:.2f} us an empty call; "
          f"next() {whole * 1e6:.1f} us host per batch; {pace / 1e6:.2f}M events/s "
          f"synchronised at the end ({n.events} events, {n.doms} DOMs, {n.pulses} pulses)")
    for name, work in parts.items():
        print(f"  {name:<40} {per_call(work, batches) * 1e6:8.1f} us")
    sync()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", type=int, default=400)
    args = ap.parse_args()
    device = torch.device(args.device)
    versions = f"torch {torch.__version__}"
    try:
        import triton

        versions += f", triton {triton.__version__}"
        kinds = ["fused", "torch"] if device.type == "cuda" else ["torch"]
    except ImportError:
        kinds = ["torch"]
    print(f"{args.dataset} on {device}; {versions}")
    for kind in kinds:
        profile(args.dataset, device, kind, args.batches)


if __name__ == "__main__":
    main()
