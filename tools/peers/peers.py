#!/usr/bin/env python3
"""The loaders Python users write, on the same Kaggle-layout data as shardbench.

    python3 tools/peers/peers.py KAGGLE_DIR [--split train] [--batch-events 256]
                                 [--cache-files 2] [--seconds 20] [--json FILE]
                                 [--dataset SHARDIFY_DIR [--window 16] [--workers 2]
                                  [--device cpu|cuda:N] [--rounds 3]]

Runs, each for at most --seconds:
  * pytorch-style: a map-style Dataset with per-event random access over the batch files,
    an LRU cache of decoded files, a shuffled DataLoader and a collate function
    (torch.utils.data when torch is installed, the same logic in plain Python otherwise);
  * numpy block shuffle: shuffle the files, read one at a time, shuffle its events, gather
    each batch with vectorised fancy indexing.
and prints events/s, pulses/s, GB/s (collated payload) and the shuffle-quality metrics of
shardbench (file mixing, lag-1 zenith autocorrelation, pair repeat, displacement).
Needs numpy and pyarrow; torch optional. Without the Kaggle download, `shardify generate
KAGGLE_DIR --events 320000 --files 8` (the wheel's command) writes data with its statistics.

With --dataset (the same source converted by `shardify convert`) it also runs, in this
process, the `shardify` Python package's loader at the same batch size: the Rust loader
alone (batches taken and dropped in Rust: the bound), then yielding torch tensors, then
the DLPack capsules torch would wrap, dropped unwrapped (the package's own side of a torch
batch; what torch's tensors cost is the difference to the row above), then numpy arrays,
then torch tensors with the gathering threads under the process's scheduling
policy (`worker_scheduling="normal"`; the default is SCHED_BATCH), then torch tensors with
the thread that waits for a batch sleeping instead of gathering one itself
(`consumer_gathers=False`), then resident (the dataset held whole on --device, at the same window and
with one window over the whole dataset), --rounds times interleaved, and prints each one's
ratio to the Rust loader (its median run over the Rust loader's, and the median of each
round's ratio to the Rust loader's run in the same round, which a shared machine's drift
disturbs less), the overhead per batch (its time per batch less the Rust loader's) and the host time per
batch (the time spent in the loader's iterator; on a GPU the resident gather runs
asynchronously beside it), and the process's CPU time per batch (all its threads).

Torch's own floor (wrapping a batch's capsules into tensors, timed alone) is set against
the Rust loader two ways: added to each batch's time (as if no other core could gather
meanwhile), and added to the CPU time a batch takes (what happens when the workers and
the waiting thread keep every core busy gathering: the floor then costs its CPU time, not
its wall time). The same floor is timed again with the core's caches as a gather leaves
them (a batch's payload copied through them before each batch's wrapping): inside a loader
torch makes every batch's tensors just after a gather has evicted its code and data.
"""
import argparse
import functools
import glob
import json
import math
import os
import sys
import time

import numpy as np
import pyarrow
import pyarrow.parquet as pq

# Return freed decode buffers to the OS at once: the naive loader decodes file after file.
pyarrow.set_memory_pool(pyarrow.system_memory_pool())

COLUMNS = ["sensor_id", "time", "charge", "auxiliary"]


def discover(root, split):
    files = sorted(glob.glob(os.path.join(root, split, "batch_*.parquet")),
                   key=lambda p: int(os.path.basename(p)[6:-8]))
    single = os.path.join(root, f"{split}_meta.parquet")
    metas = [single] if os.path.exists(single) else sorted(glob.glob(os.path.join(root, f"{split}_meta", "*.parquet")))
    return files, metas


def load_index(files, metas):
    """Per event, in stored order: file index, first row, last row (inclusive), id, zenith."""
    meta = [pq.read_table(m).to_pydict() for m in metas]
    by_batch = {}
    for table in meta:
        zen = table.get("zenith", [math.nan] * len(table["event_id"]))
        for b, e, f, l, z in zip(table["batch_id"], table["event_id"], table["first_pulse_index"], table["last_pulse_index"], zen):
            by_batch.setdefault(b, []).append((f, l, e, z))
    rows = []
    for i, path in enumerate(files):
        batch_id = int(os.path.basename(path)[6:-8])
        for f, l, e, z in sorted(by_batch.get(batch_id, [])):
            rows.append((i, f, l, e, z, batch_id))
    a = np.array(rows, dtype=np.float64)
    return {"file": a[:, 0].astype(np.int64), "first": a[:, 1].astype(np.int64), "last": a[:, 2].astype(np.int64),
            "event_id": a[:, 3].astype(np.int64), "zenith": a[:, 4], "batch_id": a[:, 5].astype(np.int64)}


def read_file(path):
    t = pq.read_table(path, columns=COLUMNS)
    return {c: t.column(c).to_numpy() for c in COLUMNS}


def payload_bytes(batch):
    return sum(v.nbytes for v in batch.values())


def pytorch_style(files, index, batch_events, cache_files, seconds, seed):
    cached_read = functools.lru_cache(maxsize=cache_files)(read_file)

    class KaggleEvents:
        def __len__(self):
            return len(index["file"])

        def __getitem__(self, i):
            data = cached_read(files[index["file"][i]])
            r = slice(index["first"][i], index["last"][i] + 1)
            # Copies: a view would keep its whole decoded file alive after the cache let it
            # go, one file per event of the batch (24 GB at 1,024 events per batch).
            return {c: data[c][r].copy() for c in COLUMNS}

    def collate(events):
        out = {c: np.concatenate([e[c] for e in events]) for c in COLUMNS}
        out["offsets"] = np.cumsum([0] + [len(e["time"]) for e in events])
        return out

    deadline = time.perf_counter() + seconds

    def take(indices):
        # One batch can take minutes here: stop at the deadline, keeping the events so far.
        events = []
        for i in indices:
            events.append(dataset[i])
            if time.perf_counter() > deadline:
                break
        return collate(events)

    dataset = KaggleEvents()
    try:
        import torch
        from torch.utils.data import DataLoader
        g = torch.Generator().manual_seed(seed)
        batches = DataLoader(dataset, batch_size=batch_events, shuffle=True, collate_fn=collate, generator=g)
        name = "pytorch Dataset + DataLoader"
    except ImportError:
        order = np.random.default_rng(seed).permutation(len(dataset))
        batches = (take(order[k:k + batch_events]) for k in range(0, len(order), batch_events))
        name = "pytorch-style Dataset (torch not installed)"
    return name, run(batches, seconds)


def numpy_block_shuffle(files, index, batch_events, seconds, seed, epoch=0):
    rng = np.random.default_rng([seed, epoch])

    def batches():
        for f in rng.permutation(len(files)):
            data = read_file(files[f])
            events = np.flatnonzero(index["file"] == f)
            rng.shuffle(events)
            for k in range(0, len(events), batch_events):
                chosen = events[k:k + batch_events]
                first, count = index["first"][chosen], index["last"][chosen] - index["first"][chosen] + 1
                offsets = np.concatenate([[0], np.cumsum(count)])
                rows = np.repeat(first - offsets[:-1], count) + np.arange(offsets[-1])
                out = {c: data[c][rows] for c in COLUMNS}
                out["offsets"] = offsets
                yield out

    return run(batches(), seconds)


def shardify_loaders(dataset, batch_events, window, workers, seconds, seed, device="cpu",
                     rounds=3):
    """The package's loader on a converted dataset: Rust alone, then torch, then its capsules
    alone, then numpy, then
    resident (at the same window, and with one window over the whole dataset: a complete
    shuffle), interleaved ``rounds`` times; the median runs, and the median of each round's
    ratio to the Rust loader's run of that round. Host time per batch is the time spent in
    the loader's iterator (on a GPU, the copies and kernels it queues run asynchronously)."""
    import shardify

    settings = dict(batch_events=batch_events, seed=seed, device=device)
    whole_dataset = shardify.Dataset(dataset)  # one rank: every event once an epoch
    whole = -(-whole_dataset.events // 256)  # blocks of 256 (the default)
    resident = {}
    for kind, w in (("resident", window), ("resident-all", whole)):
        started = time.perf_counter()
        resident[kind] = shardify.Loader(dataset, window_blocks=w, resident=True, **settings)
        resident[kind]._batches.columns  # read now (else at the first batch), to be timed
        resident[kind + "-load"] = time.perf_counter() - started

    def timed(kind):
        if kind.startswith("resident"):
            loader = resident[kind]
        else:
            loader = shardify.Loader(dataset, window_blocks=window, workers=workers,
                                     output="numpy" if kind == "numpy" else "torch",
                                     worker_scheduling="normal" if kind == "normal" else "batch",
                                     consumer_gathers=kind != "sleeps",
                                     **settings)
        batches = events = pulses = 0
        host = 0.0
        cpu_started = time.process_time()  # every thread of the process, exited ones too
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            if kind == "rust":
                b, e, p, _ = loader._native.drain()
                batches, events, pulses = batches + b, events + e, pulses + p
                continue
            # A whole epoch (every event once: one rank), counted as a whole: a clock read
            # and two len() calls per batch cost the consumer about 1 us of CPU a batch,
            # which the Rust loader's rows do not pay (2-core Zen 5, docs/results.md).
            if kind == "capsules":
                # The package's own side of a torch batch: the capsules torch would wrap,
                # dropped unwrapped.
                next_capsules = loader._native.next_batch_capsules
                while next_capsules(None) is not None:
                    batches += 1
            else:
                t0 = time.perf_counter()
                for _ in loader:
                    batches += 1
                host += time.perf_counter() - t0
            events, pulses = events + whole_dataset.events, pulses + whole_dataset.pulses
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        return {"batches": batches, "events": events, "seconds": elapsed,
                "events_per_s": events / elapsed, "pulses_per_s": pulses / elapsed,
                "us_per_batch": elapsed / batches * 1e6,
                "cpu_us_per_batch": cpu / batches * 1e6, "busy_cpus": cpu / elapsed,
                "host_us_per_batch": (host if kind not in ("rust", "capsules") else elapsed)
                / batches * 1e6}

    names = {"rust": "shardify, Rust loader alone (bound)", "torch": "shardify -> torch tensors",
             "capsules": "shardify -> DLPack capsules, no tensors",
             "numpy": "shardify -> numpy arrays",
             "normal": "shardify -> torch, workers' policy normal",
             "sleeps": "shardify -> torch, waiting thread sleeps",
             "resident": f"shardify resident ({device}, window {window})",
             "resident-all": f"shardify resident ({device}, complete shuffle)"}
    if device.startswith("cuda"):
        del names["numpy"]
    runs = {k: [] for k in names}
    for round_index in range(rounds):
        for k in names:
            runs[k].append(timed(k))
        # Each round as it ends, on stderr: a run cut short by a time limit keeps these.
        rust = runs["rust"][-1]["events_per_s"]
        print(f"round {round_index + 1} of {rounds}: " + "; ".join(
            f"{names[k]} {runs[k][-1]['events_per_s'] / 1e6:.2f}M events/s"
            + ("" if k == "rust" else f" ({runs[k][-1]['events_per_s'] / rust:.2f}x)")
            for k in names), file=sys.stderr, flush=True)
    out = []
    for k, name in names.items():
        best = sorted(runs[k], key=lambda r: r["events_per_s"])[rounds // 2]  # the median run
        row = dict(name=name, **best, runs=[r["events_per_s"] for r in runs[k]],
                   cpu_us_per_batch_runs=[r["cpu_us_per_batch"] for r in runs[k]])
        # Each round's run over the Rust loader's run just before it in the same round: a
        # shared machine drifts less between neighbouring runs than across the rounds.
        row["paired_ratios_to_rust"] = [
            r["events_per_s"] / b["events_per_s"] for r, b in zip(runs[k], runs["rust"],
                                                                 strict=True)]
        row["median_paired_ratio_to_rust"] = sorted(row["paired_ratios_to_rust"])[rounds // 2]
        # The process's CPU per batch beyond the Rust loader's, round by round.
        row["median_paired_cpu_added_us_per_batch"] = median_cpu_over(runs[k], runs["rust"])
        if k.startswith("resident"):
            row["load_seconds"] = resident[k + "-load"]
        out.append(row)
    rust = out[0]
    for row in out:
        row["ratio_to_rust"] = row["events_per_s"] / rust["events_per_s"]
        row["python_overhead_us_per_batch"] = row["us_per_batch"] - rust["us_per_batch"]
    # A batch's sections and payload, from host memory whatever the rows' device: numpy
    # output lives on the host (a cuda device here was refused, so a GPU run failed after
    # its rounds, before its summary).
    first = next(iter(shardify.Loader(dataset, output="numpy", **dict(settings, device="cpu"))))
    sections, batch_bytes = len(first), payload_bytes(first)
    del first
    floor = torch_wrap_floor(sections)
    out[1]["torch_wrap_floor_us_per_batch"] = floor
    out[1]["batch_payload_bytes"] = batch_bytes
    out[1]["torch_wrap_cold_floor_us_per_batch"] = torch_wrap_cold_floor(sections, batch_bytes)
    # As if no other core could work while the consumer wraps: the floor added to each of
    # the Rust loader's batches.
    out[1]["ratio_to_rust_with_floor_added"] = rust["us_per_batch"] / (rust["us_per_batch"] + floor)
    # What the machine does when every core gathers (the workers and the waiting thread keep
    # the CPUs busy): the floor is CPU time taken from gathering, out of all the CPU time
    # a Rust loader's batch takes (its median run).
    out[1]["ratio_to_rust_with_floor_cpu_added"] = rust["cpu_us_per_batch"] / (
        rust["cpu_us_per_batch"] + floor)
    # The same with the CPU the torch row measured above the Rust loader's, round by round:
    # where every core gathers, its paired ratio.
    out[1]["ratio_to_rust_from_cpu_added"] = rust["cpu_us_per_batch"] / (
        rust["cpu_us_per_batch"] + out[1]["median_paired_cpu_added_us_per_batch"])
    # The torch row's CPU beyond the capsules row's, round by round: what torch's tensors
    # (and the batch's dict) cost inside the loader, where the cores are busy gathering,
    # against the floor timed alone (twice it on a 2-core Xeon, docs/results.md).
    out[1]["torch_over_capsules_cpu_us_per_batch"] = median_cpu_over(runs["torch"],
                                                                     runs["capsules"])
    return out


def median_cpu_over(runs, baseline_runs):
    """The median, over the rounds (an odd count), of each run's CPU per batch less the
    baseline's run in the same round."""
    added = sorted(r["cpu_us_per_batch"] - b["cpu_us_per_batch"]
                   for r, b in zip(runs, baseline_runs, strict=True))
    return added[len(added) // 2]


def torch_converter():
    """torch's own capsule import, as the package's torch batches call it."""
    import torch

    return getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack


def torch_wrap_floor(sections, batches=20000):
    """Microseconds torch itself takes to turn ``sections`` DLPack capsules into tensors, per
    batch: capsules made by numpy (no shardify code), their making subtracted; the median
    of three rounds. What any DLPack loader yielding that many tensors pays (the batch's
    dict, which shardify builds in Rust, left out)."""
    arrays = [np.zeros(64, dtype=np.float32) for _ in range(sections)]
    convert = torch_converter()
    rounds = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(batches):
            capsules = [a.__dlpack__() for a in arrays]
        making = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(batches):
            batch = list(map(convert, [a.__dlpack__() for a in arrays]))
        rounds.append((time.perf_counter() - started - making) / batches * 1e6)
    del capsules, batch
    return sorted(rounds)[1]


def torch_wrap_cold_floor(sections, batch_bytes, batches=2000, buffers=4):
    """The same floor with the core's caches as a gather leaves them: before each batch's
    wrapping, ``batch_bytes`` (a batch's payload) are copied from a region far larger than
    the caches into the next of ``buffers`` batch-sized buffers, as a gather reads the
    shards into the pool's staging buffers in turn; only the wrapping is timed (the
    clock's own cost subtracted). Inside a loader on a 2-core machine every batch's tensors
    are made just after such a gather, on this core or another thread's on it."""
    arrays = [np.zeros(64, dtype=np.float32) for _ in range(sections)]
    convert = torch_converter()
    batch_bytes = max(int(batch_bytes), 64)
    region = np.empty(max(256 << 20, 16 * batch_bytes), dtype=np.uint8)
    region.fill(1)
    targets = [np.empty(batch_bytes, dtype=np.uint8) for _ in range(buffers)]
    clock = time.perf_counter
    rounds, at, batch = [], 0, None
    for _ in range(3):
        wrapping = 0.0
        for i in range(batches):
            if at + batch_bytes > region.size:
                at = 0
            np.copyto(targets[i % buffers], region[at:at + batch_bytes])
            at += batch_bytes
            capsules = [a.__dlpack__() for a in arrays]
            started = clock()
            batch = list(map(convert, capsules))
            wrapping += clock() - started
        started = clock()
        for _ in range(batches):
            clock()
        reading = (clock() - started) / batches  # one clock read (two bracket each batch)
        rounds.append((wrapping / batches - reading) * 1e6)
    del batch
    return sorted(rounds)[1]


def run(batches, seconds):
    started = time.perf_counter()
    events = pulses = nbytes = 0
    for batch in batches:
        events += len(batch["offsets"]) - 1
        pulses += len(batch["time"])
        nbytes += payload_bytes(batch)
        if time.perf_counter() - started > seconds:
            break
    elapsed = time.perf_counter() - started
    return {"events": events, "seconds": elapsed, "events_per_s": events / elapsed,
            "pulses_per_s": pulses / elapsed, "gb_per_s": nbytes / elapsed / 1e9}


def orders(index, n_files, batch_events, seed):
    """Epochs 0 and 1 of each loader's event order, as lists of index arrays per batch."""
    n = len(index["file"])
    cut = lambda order: [order[k:k + batch_events] for k in range(0, n, batch_events)]
    torch_like = [cut(np.random.default_rng([seed, e]).permutation(n)) for e in (0, 1)]
    blocks = []
    for e in (0, 1):
        rng = np.random.default_rng([seed, e])
        order = []
        for f in rng.permutation(n_files):
            events = np.flatnonzero(index["file"] == f)
            rng.shuffle(events)
            order.extend(events)
        blocks.append(cut(np.array(order)))
    return torch_like, blocks


def quality(index, epochs, batch_events):
    first, second = epochs
    files = index["batch_id"]
    def entropy(b):
        _, c = np.unique(b, return_counts=True)
        p = c / c.sum()
        return -(p * np.log2(p)).sum()
    rng = np.random.default_rng(0x5EED)
    mixing = np.mean([entropy(files[b]) for b in first]) / np.mean([entropy(rng.choice(files, len(b))) for b in first])
    z = index["zenith"][np.concatenate(first)]
    autocorr = None if np.isnan(z).any() else float(np.corrcoef(z[:-1], z[1:])[0, 1])
    batch_of = np.empty(len(files), dtype=np.int64)
    for k, b in enumerate(second):
        batch_of[b] = k
    # Every same-batch pair of the first epoch, counted exactly: a batch whose events fall
    # c_1, c_2, ... to batches of the second epoch repeats sum c_k (c_k - 1) / 2 pairs.
    sizes = np.array([len(b) for b in first], dtype=np.int64)
    key = np.repeat(np.arange(len(first)), sizes) * len(second) + batch_of[np.concatenate(first)]
    _, together = np.unique(key, return_counts=True)
    repeat = float((together * (together - 1) // 2).sum() / max((sizes * (sizes - 1) // 2).sum(), 1))
    stream = np.concatenate(first)
    displacement = float(np.mean(np.abs(np.arange(len(stream)) - stream)) / len(stream))
    return {"file_mixing": float(mixing), "label_autocorrelation": autocorr, "pair_repeat": repeat,
            "pair_repeat_iid": (batch_events - 1) / max(len(files) - 1, 1), "displacement": displacement}


def machine(device):
    """The machine (``device`` the one the shardify rows ask for), as shardbench names it
    (src/bench/machine.rs, through the package): the CPU count, model name, signature
    (vendor, family, model, stepping) and last-level cache, and the CPU described in one
    line. The figures differ by CPU far more than by run, and a VM's model name can hide
    which CPU it is, so every report names them. Without the package, only the CPU count."""
    try:
        from shardify._native import machine as probe
    except ImportError:
        return {"cpus": os.cpu_count()}, "CPU unknown: the shardify package is not installed"
    facts, described = probe(device)
    return json.loads(facts), described


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("--split", default="train")
    ap.add_argument("--batch-events", type=int, default=256)
    ap.add_argument("--cache-files", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--dataset", help="the source converted by `shardify convert`")
    ap.add_argument("--window", type=int, default=16, help="shardify window_blocks")
    ap.add_argument("--workers", type=int, default=2, help="shardify worker threads")
    ap.add_argument("--device", default="cpu", help="shardify device (cpu, cuda:N)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of the shardify package's loaders (odd: a median)")
    args = ap.parse_args()
    if args.rounds < 1 or args.rounds % 2 == 0:
        ap.error(f"--rounds {args.rounds}: expected an odd count of at least 1")
    files, metas = discover(args.source, args.split)
    index = load_index(files, metas)
    torch_orders, block_orders = orders(index, len(files), args.batch_events, args.seed)
    name, torch_figures = pytorch_style(files, index, args.batch_events, args.cache_files, args.seconds, args.seed)
    loaders = [
        dict(name=name, **torch_figures, quality=quality(index, torch_orders, args.batch_events)),
        dict(name="numpy block shuffle", **numpy_block_shuffle(files, index, args.batch_events, args.seconds, args.seed),
             quality=quality(index, block_orders, args.batch_events)),
    ]
    host, cpu = machine(args.device)
    print(f"{len(index['file'])} events in {len(files)} files; batches of {args.batch_events}; "
          f"{host['cpus']} CPUs ({cpu})")
    print(f"{'loader':<44} {'events/s':>11} {'pulses/s':>12} {'GB/s':>7} {'mixing':>7} {'autocor':>8} {'repeat':>7} {'displ':>6}")
    for l in loaders:
        q = l["quality"]
        ac = "-" if q["label_autocorrelation"] is None else f"{q['label_autocorrelation']:.3f}"
        print(f"{l['name']:<44} {l['events_per_s']:>11.0f} {l['pulses_per_s']:>12.0f} {l['gb_per_s']:>7.3f} "
              f"{q['file_mixing']:>7.3f} {ac:>8} {q['pair_repeat']:>7.4f} {q['displacement']:>6.3f}")
    package = []
    if args.dataset:
        package = shardify_loaders(args.dataset, args.batch_events, args.window, args.workers,
                                   args.seconds, args.seed, args.device, args.rounds)
        print(f"\n{'shardify package (same process)':<44} {'events/s':>11} {'pulses/s':>12} "
              f"{'us/batch':>9} {'host us/batch':>14} {'x Rust':>7} {'paired':>7} "
              f"{'overhead us/batch':>18} {'CPU us/batch':>13}")
        for l in package:
            print(f"{l['name']:<44} {l['events_per_s']:>11.0f} {l['pulses_per_s']:>12.0f} "
                  f"{l['us_per_batch']:>9.1f} {l['host_us_per_batch']:>14.1f} {l['ratio_to_rust']:>7.2f} "
                  f"{l['median_paired_ratio_to_rust']:>7.2f} {l['python_overhead_us_per_batch']:>18.1f} "
                  f"{l['cpu_us_per_batch']:>13.1f}")
        print("x Rust: the median run over the Rust loader's median run; paired: the median of "
              "each round's run over the Rust loader's run in the same round; CPU: the process's "
              f"CPU time (all its threads) per batch, in the median run ({args.rounds} "
              "rounds: " + ", ".join(f"{r:.2f}" for r in package[1]["paired_ratios_to_rust"])
              + f" for {package[1]['name']})")
        for l in package:
            if "load_seconds" in l:
                print(f"{l['name']}: dataset loaded in {l['load_seconds']:.1f} s")
        block = loaders[1]["events_per_s"]
        for l in package[1:]:
            print(f"{l['name']}: {l['events_per_s'] / block:.1f}x the numpy block shuffle")
        by_name = {l["name"]: l for l in package}
        capsules = by_name["shardify -> DLPack capsules, no tensors"]
        print(f"the package's own side of a torch batch (its capsules, no tensors): paired "
              f"{capsules['median_paired_ratio_to_rust']:.2f}x the Rust loader; with torch's "
              f"tensors: {package[1]['median_paired_ratio_to_rust']:.2f}x")
        torch_row, rust = package[1], package[0]
        floor, rust_us = torch_row["torch_wrap_floor_us_per_batch"], rust["us_per_batch"]
        print(f"torch's own floor: wrapping a batch's capsules into tensors takes "
              f"{floor:.1f} us ({floor / rust_us:.1%} of the Rust loader's {rust_us:.1f} us per "
              f"batch); 0.9x the Rust loader leaves {rust_us / 9:.1f} us per batch for all the "
              f"consumer's work, or {rust['cpu_us_per_batch'] / 9:.1f} us of CPU where every "
              "core gathers; the floor alone added to each of the Rust loader's batches "
              f"gives {torch_row['ratio_to_rust_with_floor_added']:.2f}x")
        print(f"CPU: the Rust loader's batches take {rust['cpu_us_per_batch']:.1f} us of the "
              f"process's CPU each ({rust['busy_cpus']:.2f} CPUs busy); torch's batches "
              f"{torch_row['median_paired_cpu_added_us_per_batch']:.1f} us more (paired), which "
              f"with every core gathering leaves {torch_row['ratio_to_rust_from_cpu_added']:.2f}x; "
              f"torch's floor alone would leave {torch_row['ratio_to_rust_with_floor_cpu_added']:.2f}x")
        inside = torch_row["torch_over_capsules_cpu_us_per_batch"]
        print(f"of which the package's capsules {capsules['median_paired_cpu_added_us_per_batch']:.1f}"
              f" us (paired), and torch's tensors with the batch's dict {inside:.1f} us more "
              f"(paired over the capsules row), {inside / floor:.1f}x torch's floor timed alone")
        cold = torch_row["torch_wrap_cold_floor_us_per_batch"]
        print(f"torch's floor with the core's caches as a gather leaves them (one batch's "
              f"{torch_row['batch_payload_bytes'] / 1024:.0f} KiB copied through them before "
              f"each batch): {cold:.1f} us, {cold / floor:.1f}x the floor timed alone; torch's "
              f"tensors with the dict inside the loader {inside / cold:.1f}x that")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": host, "loaders": loaders, "shardify": package,
                       "batch_events": args.batch_events}, f, indent=2)


if __name__ == "__main__":
    main()
