#!/usr/bin/env python3
"""What ``torch.compile`` costs a DynEdge-shaped model whose layers call ``knn_edges``.

    python tools/compile_check.py DATASET [--device cpu|cuda:N] [--batches 9]
                                  [--batch-events 32] [--max-pulses 64] [--width 0.25]
                                  [--backend inductor] [--traced]

Compiles examples/train_dynedge.py's DynEdge (its EdgeConv blocks rebuild kNN graphs with
``shardify.transforms.knn_edges``) with ``torch.compile(backend=...)``, runs it on
``--batches`` ``to_pyg`` graphs of the dataset, and prints each batch's seconds (the
compiles happen inside them), Dynamo's graphs and graph breaks, and the largest difference
from the uncompiled model's output, beside the uncompiled model's difference from itself run
twice on the same batches (on a GPU its scatter sums add in no fixed order, so that floor need
not be zero, and the model's kNN graphs, rebuilt from its own features, can change a neighbour
where two distances nearly tie). The transforms read sizes on the host, so the library
has ``torch.compile`` call them rather than trace them; ``--traced`` compiles the model with
the transforms' unwrapped functions instead (``inspect.unwrap``), to show what tracing them
would cost: each batch's sizes compiling again until Dynamo gives up on those frames.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import time

import shardify
import torch
import torch._dynamo
from adapters_bench import dynedge_example
from shardify.torch_geometric import to_pyg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, default=9)
    ap.add_argument("--batch-events", type=int, default=32)
    ap.add_argument("--max-pulses", type=int, default=64)
    ap.add_argument("--width", type=float, default=0.25)
    ap.add_argument("--backend", default="inductor",
                    help="torch.compile's backend (eager: Dynamo's tracing alone, no code "
                         "generated)")
    ap.add_argument("--traced", action="store_true",
                    help="compile with the transforms traced, as they were before")
    args = ap.parse_args()

    example = dynedge_example()
    if args.traced:
        example.knn_edges = inspect.unwrap(example.knn_edges)
    loader = shardify.Loader(args.dataset, batch_events=args.batch_events, device=args.device,
                             seed=1)
    device = loader.device
    graphs = [to_pyg(batch, standardize="graphnet", knn=8, max_pulses=args.max_pulses)
              for batch in itertools.islice(loader, args.batches)]
    torch.manual_seed(0)
    model = example.DynEdge(6, k=8, width=args.width).to(device)
    compiled = torch.compile(model, backend=args.backend)
    torch._dynamo.utils.counters.clear()
    seconds, differences, floor = [], [], []
    for g in graphs:
        started = time.perf_counter()
        out = compiled(g)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
        with torch.no_grad():
            eager = model(g)
            differences.append((out - eager).abs().max().item())
            floor.append((model(g) - eager).abs().max().item())
    counters = torch._dynamo.utils.counters
    what = "traced" if args.traced else "called, untraced"
    print(f"{len(graphs)} batches of {args.batch_events} events on {device}, backend "
          f"{args.backend}, the transforms {what}")
    print("seconds per batch: " + ", ".join(f"{s:.2f}" for s in seconds))
    print(f"graphs {counters['stats']['unique_graphs']}, graph breaks "
          f"{sum(counters['graph_break'].values())}, largest difference from the "
          f"uncompiled model {max(differences):.2e} (the uncompiled model against itself "
          f"{max(floor):.2e})")


if __name__ == "__main__":
    main()
