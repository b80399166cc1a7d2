#!/usr/bin/env python3
"""Does a long job leak? Runs the Python loader for many epochs, then creates and drops many
loaders, and checks that memory, threads and open files stay flat.

    python tools/leak_check.py DATASET [--epochs 200] [--loaders 1000] [--batch-events 256]
                               [--resident] [--device cpu] [--rss-slack-mib 2] [--json FILE]

Phases, each measured after a garbage collection and ``malloc_trim`` (so that RSS counts
memory in use, not the allocator's free lists):
  1. ``--epochs`` whole epochs through one ``shardify.Loader`` (torch tensors, each batch
     touched and dropped): resident memory (VmRSS), threads (/proc/self/task), open files
     (/proc/self/fd) and the loader's staging allocations after every epoch;
  2. ``--loaders`` loaders created, iterated one batch and dropped;
  3. as many loaders broken off in the middle of an epoch (half its batches), then dropped.
Growth is measured from the end of the first epoch (the first epoch allocates the pools,
maps the shards, starts torch's own threads); over the loaders, RSS growth is measured from
the first tenth of them on (what the first few add, the allocator's arenas settling, is
reported apart: a leak grows with the count). The check fails (exit status 1) when RSS
grows by more than ``--rss-slack-mib`` or threads, open files or staging allocations grow
at all.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import time


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _trim() -> None:
    """Hands the allocator's free memory back to the kernel (glibc), so RSS counts memory in
    use, not free lists a previous phase left behind."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def sample() -> dict[str, int]:
    gc.collect()
    # A resident loader's next-epoch plan may still run after the loader is gone (its
    # sampler thread ends with it): let it finish, or a dropped loader's plan counts as a
    # leaked thread.
    if "shardify._resident.source" in sys.modules:
        sys.modules["shardify._resident.source"].settle_planner()
    _trim()
    return {"rss": rss_bytes(), "threads": len(os.listdir("/proc/self/task")),
            "files": len(os.listdir("/proc/self/fd"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--loaders", type=int, default=1000)
    ap.add_argument("--batch-events", type=int, default=256)
    ap.add_argument("--resident", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rss-slack-mib", type=float, default=2.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import shardify

    settings = dict(batch_events=args.batch_events, device=args.device,
                    resident=args.resident)
    dataset = shardify.Dataset(args.dataset)
    loader = shardify.Loader(dataset, **settings)
    epochs = []
    started = time.perf_counter()
    for epoch in range(args.epochs):
        events = 0
        for batch in loader:
            events += int(batch["event_id"].shape[0])
            del batch
        figures = sample()
        figures["staging_allocations"] = loader.staging_allocations
        figures["events"] = events
        epochs.append(figures)
        if epoch == 0 or (epoch + 1) % max(1, args.epochs // 10) == 0:
            print(f"epoch {epoch + 1:>5}: rss {figures['rss'] / 2**20:8.1f} MiB, "
                  f"threads {figures['threads']}, files {figures['files']}, staging "
                  f"allocations {figures['staging_allocations']}, {events} events", flush=True)
    epoch_seconds = time.perf_counter() - started
    del loader
    after_epochs = sample()

    def churn(take_half: bool) -> tuple[dict[str, int], dict[str, int]]:
        """Figures after the first tenth of the loaders, and after all of them."""
        early = None
        for n in range(1, args.loaders + 1):
            churned = shardify.Loader(dataset, **settings)
            it = iter(churned)
            for _ in range(max(1, len(churned) // 2) if take_half else 1):
                next(it)
            del it, churned
            if n == max(1, args.loaders // 10):
                early = sample()
        return early, sample()

    started = time.perf_counter()
    early_one_batch, after_one_batch = churn(take_half=False)
    early_breaks, after_breaks = churn(take_half=True)
    churn_seconds = time.perf_counter() - started
    base = epochs[0]
    report = {
        "dataset": args.dataset, "resident": args.resident, "epochs": args.epochs,
        "loaders": args.loaders, "epoch_seconds": epoch_seconds, "churn_seconds": churn_seconds,
        "first_epoch": base, "last_epoch": epochs[-1], "after_epochs": after_epochs,
        "after_one_batch_loaders": after_one_batch, "after_broken_off_loaders": after_breaks,
        "rss_growth_mib": {
            "epochs": (epochs[-1]["rss"] - base["rss"]) / 2**20,
            "one_batch_loaders": (after_one_batch["rss"] - early_one_batch["rss"]) / 2**20,
            "broken_off_loaders": (after_breaks["rss"] - early_breaks["rss"]) / 2**20,
        },
        # What the first tenth of the loaders added (the allocator's arenas settling: a
        # one-time rise, where a leak would grow with the count measured above).
        "rss_first_tenth_mib": {
            "one_batch_loaders": (early_one_batch["rss"] - after_epochs["rss"]) / 2**20,
            "broken_off_loaders": (early_breaks["rss"] - after_one_batch["rss"]) / 2**20,
        },
    }
    problems = []
    for phase, growth in report["rss_growth_mib"].items():
        if growth > args.rss_slack_mib:
            problems.append(f"RSS grew {growth:.2f} MiB over the {phase}")
    for name in ("threads", "files"):
        for phase, figures in (("epochs", epochs[-1]), ("one-batch loaders", after_one_batch),
                               ("broken-off loaders", after_breaks)):
            if figures[name] > base[name]:
                problems.append(f"{name}: {base[name]} after the first epoch, "
                                f"{figures[name]} after the {phase}")
    if epochs[-1]["staging_allocations"] > base["staging_allocations"]:
        problems.append(f"staging allocations grew: {base['staging_allocations']} -> "
                        f"{epochs[-1]['staging_allocations']}")
    if len({e["events"] for e in epochs}) != 1:
        problems.append("epochs delivered different numbers of events")
    report["problems"] = problems
    print(f"{args.epochs} epochs in {epoch_seconds:.1f} s; {2 * args.loaders} loaders in "
          f"{churn_seconds:.1f} s; RSS growth (MiB): "
          + ", ".join(f"{k} {v:+.2f}" for k, v in report["rss_growth_mib"].items())
          + " (first tenth of the loaders: "
          + ", ".join(f"{k} {v:+.2f}" for k, v in report["rss_first_tenth_mib"].items()) + ")"
          + f"; threads {base['threads']} -> {after_breaks['threads']}, files "
          f"{base['files']} -> {after_breaks['files']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    for problem in problems:
        print(f"LEAK: {problem}", file=sys.stderr)
    print("no leak" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
