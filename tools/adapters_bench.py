#!/usr/bin/env python3
"""What the model-ready adapters cost per batch, beside the loader and a DynEdge step.

    python tools/adapters_bench.py DATASET [--batch-events 256] [--batches 12]
                                   [--device cpu|cuda:N] [--width 1.0] [--max-pulses 256]
                                   [--block-costs 2^19,2^23] [--training-loop] [--fused-knn]

Takes --batches batches from ``shardify.Loader`` and times, per batch (medians):

* the loader alone: the same loader drained in Rust (``drain``: the bound of the Python
  loader), per batch;
* ``time_ordered`` without a cut, and with ``max_pulses`` under each ``keep`` rule;
* ``pad_pulses`` on the cut pulses, to the longest event and to ``max_pulses``, beside what
  a user writes without it (``torch.split`` by the events' counts, read to the host, then
  ``pad_sequence`` per section, and the mask): the same grids, checked equal; and
  ``pulse_sequences`` (the cut, GraphNeT's features and the padding to ``max_pulses``: a
  transformer's whole input, as examples/train_transformer.py makes it);
* ``knn_edges`` (k=8) on the cut pulses (distances per pulse, and per DOM as ``to_pyg``
  computes them on the CPU, and on a GPU for events cut to more than 256 pulses), and the
  whole ``to_pyg(standardize="graphnet", knn=8, max_pulses=...)``;
* the adapter's torch operations per batch (views left out: on a GPU, its kernel launches),
  and what that many trivial operations cost on this device (the floor of an adapter made
  of that many torch operations, however little each computes);
* ``knn_edges`` per DOM under three block plans: the default cost model, one block per size
  class, and the fewest blocks the memory budget allows (what a block's fixed cost is
  worth on this device), and under each cost in ``--block-costs``: each plan's blocks and
  padded pairs per batch, plans that give the same blocks named, the plans timed in
  alternated rounds;
* a floor for any adapter: one memcpy of the bytes ``to_pyg`` returns, in the same run;
* a DynEdge-shaped model's training step (examples/train_dynedge.py) on those graphs:
  forward, backward, optimiser step;
* the same steps as a training loop runs them, back to back over every batch with the
  device synchronised once before and once after the loop: on graphs made beforehand, and
  with ``to_pyg`` called before each step. Their difference is what the adapter costs a
  training job per batch, where on a GPU its launches can run while the device still works
  on the step before (rounds of the two loops alternated, medians);
* on a GPU with Triton (or anywhere with ``--fused-knn``), the kNN on the cut pulses, the
  adapter, the DynEdge step (whose EdgeConv blocks rebuild kNN graphs) and the training
  loop again with ``SHARDIFY_KNN=fused``: one Triton kernel for the edges instead of the
  torch operations' distance blocks. On such a GPU that kernel is the default; every other
  row runs the torch operations (``SHARDIFY_KNN=torch``, set for them whatever the
  environment says), so that the two paths stand side by side.

and prints the adapter's time against the loader's and as a share of the step. On a GPU
every other timing synchronises the device first and last. Each row runs its work on every
batch once untimed first (kernel loading, the allocator's growth).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import shardify
import shardify.transforms as transforms
import torch
from shardify.torch_geometric import to_pyg
from shardify.transforms import knn_edges, pad_pulses, pulse_sequences, time_ordered
from torch.nn.utils.rnn import pad_sequence
from torch.utils._python_dispatch import TorchDispatchMode


def timed(device: torch.device, work: Callable[[], Any], repeat: int = 1) -> float:
    """Median seconds of ``work`` over ``repeat`` runs (device synchronised)."""
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_warm(device: torch.device, works: list[Callable[[], Any]]) -> float:
    """Median seconds of each of ``works``, timed after one untimed run of them all (on a GPU
    the first call of a kernel loads it, and a new shape can pick a new kernel: an H200 run
    timed the first kNN rows at twice their warm time)."""
    for work in works:
        work()
    return statistics.median(timed(device, work) for work in works)


def training_loop(device: torch.device, alone: Callable[[], Any],
                  adapted: Callable[[], Any], batches: int,
                  rounds: int = 3) -> tuple[float, float]:
    """Seconds per batch of two loops over ``batches`` batches, each run once untimed, then
    ``rounds`` times alternated, each timed with one synchronisation before and after:
    medians of ``alone`` (the steps on graphs made beforehand) and of ``adapted`` (the same
    steps, each graph made just before)."""
    alone()
    adapted()
    times: dict[str, list[float]] = {"alone": [], "adapted": []}
    for _ in range(rounds):
        for name, loop in (("alone", alone), ("adapted", adapted)):
            times[name].append(timed(device, loop) / batches)
    return statistics.median(times["alone"]), statistics.median(times["adapted"])


def split_and_pad(pulses: dict[str, Any]) -> dict[str, Any]:
    """``pad_pulses(pulses)`` as a user writes it without it: the events' counts read to the
    host, each ``pulse_*`` section split by them and padded by ``pad_sequence``, the mask
    from the counts."""
    counts = pulses["event_pulse_offsets"].diff()
    sizes = counts.tolist()
    out = {name: section for name, section in pulses.items()
           if name.startswith("event_") and name != "event_pulse_offsets"}
    for name, section in pulses.items():
        if name.startswith("pulse_"):
            out[name] = pad_sequence(list(torch.split(section, sizes)), batch_first=True)
    length = out["pulse_time"].shape[1]
    out["pulse_mask"] = torch.arange(length, device=counts.device) < counts[:, None]
    out["event_pulses"] = counts
    return out


def same_grids(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """Stops the bench where two padded batches differ (a timing of unequal work)."""
    if got.keys() != expected.keys() or not all(
            torch.equal(got[name], expected[name]) for name in got):
        sys.exit("adapters_bench: pad_pulses and split + pad_sequence gave different grids")


def dynedge_example() -> Any:
    """examples/train_dynedge.py as a module (it imports its neighbour adapted_training.py,
    which imports checkpoints.py): its DynEdge model, here and in tools/compile_check.py."""
    examples = Path(__file__).resolve().parents[1] / "examples"
    sys.path.insert(0, str(examples))
    spec = importlib.util.spec_from_file_location("train_dynedge", examples / "train_dynedge.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules["train_dynedge"] = example
    spec.loader.exec_module(example)
    return example


@contextmanager
def knn_method(method: str) -> Iterator[None]:
    """knn_edges computing edges without groups by ``method`` (``SHARDIFY_KNN``)."""
    saved = os.environ.get(transforms.KNN_VARIABLE)
    os.environ[transforms.KNN_VARIABLE] = method
    try:
        yield
    finally:
        if saved is None:
            del os.environ[transforms.KNN_VARIABLE]
        else:
            os.environ[transforms.KNN_VARIABLE] = saved


@contextmanager
def block_cost(pairs: int) -> Iterator[None]:
    """knn_edges (on any device) with ``pairs`` as the cost of a distance block."""
    saved = transforms._knn_block_cost_pairs
    transforms._knn_block_cost_pairs = lambda device: pairs
    try:
        yield
    finally:
        transforms._knn_block_cost_pairs = saved


def block_shapes(work: Callable[[], Any]) -> list[tuple[int, int, int]]:
    """The distance blocks knn_edges computes during ``work``, in order: each one's events,
    the node count they are padded to, and their largest group count."""
    real, shapes = transforms._knn_block, []

    def recorded(planes: Any, slot: Any, group_planes: Any, block: Any, *rest: Any) -> None:
        shapes.append((int(block.counts.shape[0]), block.size, block.width))
        real(planes, slot, group_planes, block, *rest)

    transforms._knn_block = recorded
    try:
        work()
    finally:
        transforms._knn_block = real
    return shapes


def alternated(device: torch.device, plans: list[tuple[str, int]],
               works: list[Callable[[], Any]], rounds: int = 3) -> dict[str, float]:
    """Median seconds of each of ``works`` under each plan's block cost: every plan warmed
    first, then timed in ``rounds`` rounds, the plans in turn (reversed every other round).
    Plans timed one after the other drift: an H200 run timed two identical plans 1.27x and
    1.66x apart, the later one slower."""
    for _, cost in plans:
        with block_cost(cost):
            for work in works:
                work()
    times: dict[str, list[float]] = {name: [] for name, _ in plans}
    for r in range(rounds):
        for name, cost in plans if r % 2 == 0 else plans[::-1]:
            with block_cost(cost):
                times[name] += [timed(device, work) for work in works]
    return {name: statistics.median(t) for name, t in times.items()}


class _Operations(TorchDispatchMode):
    """Counts the torch operations dispatched inside it, views left out."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_operations(work: Callable[[], Any]) -> int:
    """Torch operations (not views) that ``work`` dispatches."""
    with _Operations() as operations:
        work()
    return operations.count


def operation_time(device: torch.device, repeat: int = 2000) -> float:
    """Seconds of one trivial torch operation on ``device``: an in-place add on one element,
    ``repeat`` in a row, synchronised once (Python's dispatch, and on a GPU the launch)."""
    x = torch.zeros(1, device=device)
    for _ in range(100):
        x.add_(1)
    return timed(device, lambda: [x.add_(1) for _ in range(repeat)]) / repeat


def block_costs(text: str) -> list[int]:
    """``--block-costs``: comma-separated pair counts, each an integer or ``2^K``."""
    costs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        base, _, power = item.partition("^")
        try:
            cost = 2 ** int(power) if power and base == "2" else int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is neither an integer nor 2^K") from None
        if cost < 0:
            raise argparse.ArgumentTypeError(f"{item!r} is negative")
        costs.append(cost)
    return costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--batch-events", type=int, default=256)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--width", type=float, default=1.0)
    ap.add_argument("--max-pulses", type=int, default=256)
    ap.add_argument("--block-costs", type=block_costs, default=[],
                    help="more block costs (pairs) to time knn_edges under, comma-separated: "
                         "integers or powers of two written 2^K (e.g. 2^19,2^23)")
    ap.add_argument("--training-loop", action="store_true",
                    help="time the training loop's rows on the CPU too (always on a GPU); on "
                         "the CPU nothing overlaps and a full-width step takes seconds, so "
                         "their difference is the adapter's own time within the steps' noise")
    ap.add_argument("--fused-knn", action="store_true",
                    help="time the Triton kNN rows on the CPU too (always on a GPU with "
                         "Triton): there only under TRITON_INTERPRET=1, Triton's interpreter, "
                         "which checks that they run but times Python")
    args = ap.parse_args()
    # The rows that do not name the Triton kernel time the torch operations, the kernel's
    # reference, also where the kernel is the default (a GPU with Triton).
    os.environ[transforms.KNN_VARIABLE] = "torch"

    drained = shardify.Loader(args.dataset, batch_events=args.batch_events, device=args.device)
    batches_, _, _, seconds = drained._native.drain()
    loader_per_batch = seconds / max(batches_, 1)

    loader = shardify.Loader(args.dataset, batch_events=args.batch_events, device=args.device)
    device = loader.device
    batches = []
    for batch in loader:
        batches.append({k: v.clone() for k, v in batch.items()})
        if len(batches) == args.batches:
            break
    n = args.max_pulses

    def per_batch(work: Callable[[dict[str, Any]], Any]) -> float:
        return median_warm(device, [lambda b=b: work(b) for b in batches])

    cut = [time_ordered(b, max_pulses=n) for b in batches]
    rows = [
        ("loader alone (Rust drain), per batch", loader_per_batch),
        ("time_ordered, no cut", per_batch(time_ordered)),
    ]
    for keep in ("non_auxiliary_first", "random", "charge"):
        rows.append((f"time_ordered, max_pulses={n}, keep={keep}",
                     per_batch(lambda b, keep=keep: time_ordered(b, max_pulses=n, keep=keep))))
    def per_cut_batch(work: Callable[[dict[str, Any]], Any]) -> float:
        return median_warm(device, [lambda p=p: work(p) for p in cut])

    for p in cut:
        same_grids(pad_pulses(p), split_and_pad(p))
    rows.append(("pad_pulses on the cut pulses, to the longest event", per_cut_batch(pad_pulses)))
    rows.append((f"pad_pulses on the cut pulses, to {n} (no host sync)",
                 per_cut_batch(lambda p: pad_pulses(p, n))))
    rows.append(("the same grids by torch.split + pad_sequence (what it replaces)",
                 per_cut_batch(split_and_pad)))
    rows.append((f"pulse_sequences to {n} (a transformer's input)",
                 per_batch(lambda b: pulse_sequences(b, n, standardize="graphnet"))))
    per_pulse = [lambda p=p: knn_edges(p["pulse_position"], p["event_pulse_offsets"], 8)
                 for p in cut]
    rows.append(("knn_edges k=8 on the cut pulses, distances per pulse",
                 median_warm(device, per_pulse)))

    def knn_per_dom(p: dict[str, Any], b: dict[str, Any]) -> Any:
        return knn_edges(p["pulse_position"], p["event_pulse_offsets"], 8,
                         groups=p["pulse_dom"], group_count=b["dom_position"].shape[0])

    rows.append(("knn_edges k=8 on the cut pulses, distances per DOM (groups)",
                 median_warm(device, [lambda p=p, b=b: knn_per_dom(p, b)
                                      for p, b in zip(cut, batches, strict=True)])))
    fused = args.fused_knn or (device.type == "cuda"
                               and importlib.util.find_spec("triton") is not None)
    if fused:
        with knn_method("fused"):
            rows.append(("knn_edges k=8 on the cut pulses, one Triton kernel",
                         median_warm(device, per_pulse)))
    # How events share distance blocks (transforms._plan_blocks): the default cost model,
    # one block per size class (no padding across sizes), and as few blocks as the memory
    # budget allows (every class padded to the largest).
    default_cost = transforms._knn_block_cost_pairs(device)
    planned = []
    plans = [("default", default_cost), ("one per size class", 0), ("fewest", 1 << 62)]
    plans += [(f"2^{cost.bit_length() - 1}" if cost & (cost - 1) == 0 else str(cost), cost)
              for cost in args.block_costs]
    per_dom = [lambda p=p, b=b: knn_per_dom(p, b) for p, b in zip(cut, batches, strict=True)]
    seconds = alternated(device, plans, per_dom)
    shapes = {}
    for name, cost in plans:
        with block_cost(cost):
            shapes[name] = block_shapes(lambda: [work() for work in per_dom])
        # Plans that cut every batch into the same blocks do the same work: named as such.
        same = next((other for other in shapes if other != name
                     and shapes[other] == shapes[name]), None)
        pairs = sum(events * size * width for events, size, width in shapes[name])
        planned.append(f"{name} ({cost}): {len(shapes[name]) / len(batches):.1f} blocks per "
                       f"batch, {pairs / len(batches) / 1e6:.2f}M padded pairs, "
                       f"{seconds[name] * 1e3:.3f} ms"
                       + (f" (the blocks of {same})" if same else ""))

    def adapt(b: dict[str, Any]) -> Any:
        """The adapter every row below times: GraphNeT's features, kNN edges, the cut."""
        return to_pyg(b, standardize="graphnet", knn=8, max_pulses=n)

    adapter = per_batch(adapt)
    rows.append((f"to_pyg graphnet, knn=8, max_pulses={n} (the adapter)", adapter))
    operations = statistics.median(count_operations(lambda b=b: adapt(b)) for b in batches)
    if fused:
        with knn_method("fused"):
            adapter_fused = per_batch(adapt)
            operations_fused = statistics.median(count_operations(lambda b=b: adapt(b))
                                                 for b in batches)
        rows.append(("the adapter with the Triton kNN (SHARDIFY_KNN=fused)", adapter_fused))
    # The floor of any adapter: writing its output once, at memcpy speed, in this run.
    graphs = [adapt(b) for b in batches]
    output_bytes = statistics.median(
        sum(v.numel() * v.element_size() for v in g.to_dict().values()
            if isinstance(v, torch.Tensor)) for g in graphs)
    batch_bytes = statistics.median(
        sum(v.numel() * v.element_size() for v in b.values()) for b in batches)
    source = torch.ones(int(output_bytes), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    memcpy = timed(device, lambda: target.copy_(source), repeat=21)
    rows.append((f"floor: memcpy of the adapter's output ({output_bytes / 1e6:.2f} MB, warm)",
                 memcpy))

    example = dynedge_example()
    model = example.DynEdge(6, k=8, width=args.width).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(g: Any) -> None:
        predicted = model(g)
        loss = (1 - (predicted * g.direction.to(predicted.dtype)).sum(-1)).mean()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    step(graphs[0])  # warm-up
    model_step = statistics.median(timed(device, lambda g=g: step(g)) for g in graphs[1:4])
    rows.append((f"DynEdge step (width {args.width}), forward + backward + AdamW", model_step))
    if fused:
        # The model's EdgeConv blocks rebuild their kNN graphs with knn_edges too.
        with knn_method("fused"):
            step(graphs[0])
            model_step_fused = statistics.median(timed(device, lambda g=g: step(g))
                                                 for g in graphs[1:4])
        rows.append(("the same step, its kNN graphs by the Triton kernel", model_step_fused))
    in_loop = None
    if device.type == "cuda" or args.training_loop:

        def loops() -> tuple[float, float]:
            """The loop on ready graphs and the loop calling to_pyg, per batch."""
            return training_loop(device, lambda: [step(g) for g in graphs],
                                 lambda: [step(adapt(b)) for b in batches], len(batches))

        steps_alone, adapted_steps = loops()
        rows.append(("a training loop's steps on ready graphs (one sync per loop)",
                     steps_alone))
        rows.append(("the same loop calling to_pyg before each step", adapted_steps))
        in_loop = (adapted_steps - steps_alone, adapted_steps)
        if fused:
            with knn_method("fused"):
                steps_alone_again, adapted_fused_steps = loops()
            rows.append(("the same loop again on ready graphs", steps_alone_again))
            rows.append(("the same loop calling to_pyg with the Triton kNN",
                         adapted_fused_steps))
            in_loop_fused = (adapted_fused_steps - steps_alone_again, adapted_fused_steps)

    events = sum(b["event_id"].shape[0] for b in batches) / len(batches)
    pulses = sum(b["pulse_time"].shape[0] for b in batches) / len(batches)
    kept = sum(p["pulse_time"].shape[0] for p in cut) / len(cut)
    print(f"{args.dataset}: {events:.0f} events, {pulses:.0f} pulses ({kept:.0f} after the "
          f"cut to {n}) per batch, on {device}")
    for name, seconds in rows:
        print(f"  {name:<62} {seconds * 1e3:10.3f} ms")
    print(f"adapter / loader: {adapter / loader_per_batch:.1f}x; adapter / DynEdge step: "
          f"{adapter / model_step:.1%}")
    if in_loop is not None:
        cost, per_batch_in_loop = in_loop
        print(f"in a training loop the adapter costs {cost * 1e3:.3f} ms per batch "
              f"({cost / per_batch_in_loop:.1%} of the loop's time per batch; "
              f"{cost / adapter:.2f}x its own time above)")
    floor = operation_time(device)
    if fused:
        print(f"with the Triton kNN: adapter / loader: {adapter_fused / loader_per_batch:.1f}x;"
              f" adapter / DynEdge step: {adapter_fused / model_step_fused:.1%} (its step with "
              f"the kernel too; {adapter_fused / model_step:.1%} of the step above); "
              f"{operations_fused:.0f} torch operations per batch (and one kernel)")
        floor_fused = operations_fused * floor
        print(f"with the Triton kNN the adapter's {operations_fused:.0f} operations cost at "
              f"least {floor_fused * 1e3:.3f} ms at one trivial operation's time "
              f"({floor_fused / loader_per_batch:.1f}x the loader's time per batch; the "
              f"adapter is {adapter_fused / floor_fused:.1f}x that floor)")
        if in_loop is not None:
            cost, per_batch_in_loop = in_loop_fused
            print(f"in a training loop the adapter with the Triton kNN costs "
                  f"{cost * 1e3:.3f} ms per batch ({cost / per_batch_in_loop:.1%} of the "
                  f"loop's time per batch)")
    print(f"the adapter runs {operations:.0f} torch operations per batch (views left out; on "
          f"a GPU each is a kernel launch), {adapter / operations * 1e6:.1f} us each on average;"
          f" one trivial operation takes {floor * 1e6:.1f} us here, so these operations cost "
          f"at least {operations * floor * 1e3:.3f} ms "
          f"({operations * floor / loader_per_batch:.1f}x the loader's time per batch)")
    print("knn_edges per DOM by block plan (block cost in pairs):")
    for line in planned:
        print(f"  {line}")
    print(f"the adapter writes {output_bytes / batch_bytes:.1f}x the bytes the loader delivers "
          f"({batch_bytes / 1e6:.2f} MB); copying them once takes "
          f"{memcpy / loader_per_batch:.1f}x the loader's time per batch")


if __name__ == "__main__":
    main()
