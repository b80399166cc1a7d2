"""What the examples that adapt each batch on its device before the model's step share
(train_dynedge.py: graphs, train_transformer.py: padded pulse sequences): their common
arguments, the labelled loader, the optimiser and checkpoints, and the training loop: the
loader's epochs, checkpoints every ``--checkpoint-every`` steps and at the end,
``--stop-after``, each epoch's mean loss, and per step the time waiting for data, in the
adapter and in the model's step, the first ``--warmup`` steps reported apart from the steady
state (on a GPU they load CUDA's kernels and libraries and grow the allocator's pools). On a
GPU each time is taken with the device synchronised, so the three parts overlap nothing."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import checkpoints
import shardify
import torch
from shardify.transforms import KEEP_RULES


def add_arguments(ap: argparse.ArgumentParser, *, lr: float, max_pulses_help: str) -> None:
    """The arguments of the examples that run :func:`train`: the dataset, ``--epochs``,
    ``--batch-events``, ``--max-pulses`` (saying ``max_pulses_help``), ``--keep``,
    ``--device``, ``--workers``, ``--lr`` (default ``lr``), ``--warmup`` (the first steps
    reported apart) and the checkpoints' (examples/checkpoints.py)."""
    ap.add_argument("dataset")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-events", type=int, default=256)
    ap.add_argument("--max-pulses", type=int, default=256, help=max_pulses_help)
    ap.add_argument("--keep", default="non_auxiliary_first", choices=KEEP_RULES)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--warmup", type=int, default=3,
                    help="first steps reported apart from the steady state")
    checkpoints.add_arguments(ap)


def labelled_loader(args: argparse.Namespace, **loader_arguments: Any) -> shardify.Loader:
    """The loader of ``args.dataset`` on ``args.device`` (with ``loader_arguments`` beside);
    a dataset without labels (a test split) stops the example."""
    loader = shardify.Loader(args.dataset, batch_events=args.batch_events, device=args.device,
                             workers=args.workers, seed=0, **loader_arguments)
    if not loader.dataset.labels:
        raise SystemExit(f"{args.dataset} has no labels (a test split): nothing to train on")
    return loader


def optimiser_and_checkpoints(args: argparse.Namespace, model: torch.nn.Module,
                              loader: shardify.Loader
                              ) -> tuple[torch.optim.Optimizer, checkpoints.Checkpoints]:
    """AdamW at ``args.lr`` over ``model``, and the checkpoints of the three at
    ``args.checkpoint``, resumed from there with ``--resume``."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr)
    saved = checkpoints.Checkpoints(args.checkpoint, model, optimiser, loader)
    if args.resume:
        saved.resume(loader.device)
    return optimiser, saved


def train(loader: Any, adapt: Callable[[dict[str, Any], int], Any],
          loss_of: Callable[[Any], torch.Tensor], events_of: Callable[[Any], int],
          optimiser: torch.optim.Optimizer, args: argparse.Namespace,
          checkpoint: Callable[[], None], adapter: str) -> None:
    """Trains over ``args.epochs`` epochs of ``loader``: each batch through ``adapt(batch,
    epoch)``, then a step on what it made, which holds ``events_of(inputs)`` events: the
    model's loss ``loss_of(inputs)`` (its forward), backward, ``optimiser``'s step.
    ``adapter`` names the adapter in the report."""
    device = loader.device
    on_gpu = device.type == "cuda"

    def now() -> float:
        if on_gpu:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    timings = []  # per step: (events, waited, adapting, stepping), times in seconds
    for _ in range(args.epochs):
        losses = []
        epoch = loader.epoch
        batches = iter(loader)
        while True:
            asked = now()
            batch = next(batches, None)
            adapt_start = now()
            if batch is None:
                break
            inputs = adapt(batch, epoch)
            step_start = now()
            loss = loss_of(inputs)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            timings.append((events_of(inputs), adapt_start - asked, step_start - adapt_start,
                            now() - step_start))
            losses.append(loss.item())
            if len(timings) % args.checkpoint_every == 0:
                checkpoint()
            if args.stop_after is not None and len(timings) >= args.stop_after:
                break
        if losses:
            mean = sum(losses) / len(losses)
            print(f"epoch {epoch}: mean loss {mean:.4f} (mean angular error "
                  f"~{math.degrees(math.acos(max(-1.0, 1 - mean))):.1f} deg)")
        if args.stop_after is not None and len(timings) >= args.stop_after:
            break
    checkpoint()
    if not timings:
        print("no steps: the epochs held no batch")
        return
    events, elapsed = sum(t[0] for t in timings), sum(sum(t[1:]) for t in timings)
    print(f"{len(timings)} steps, {events} events in {elapsed:.2f} s: "
          f"{events / max(elapsed, 1e-12):,.0f} events/s")
    warm = min(max(args.warmup, 0), len(timings) - 1)
    if warm:
        report(f"warm-up (the first {warm} steps)", timings[:warm], adapter)
    report(f"steady state ({len(timings) - warm} steps)" if warm else "all steps",
           timings[warm:], adapter)


def report(title: str, timings: list[tuple[int, float, float, float]], adapter: str) -> None:
    """Prints events/s and the per-batch waiting, adapter and model times of ``timings``."""
    events, waited, adapting, stepping = (sum(column) for column in zip(*timings, strict=True))
    elapsed = waited + adapting + stepping
    per = 1e3 / len(timings)
    print(f"{title}: {events / max(elapsed, 1e-12):,.0f} events/s; per batch: waiting for "
          f"data {waited * per:.2f} ms, adapter ({adapter}) {adapting * per:.2f} ms, model "
          f"step {stepping * per:.2f} ms; adapter share of a step "
          f"{adapting / max(adapting + stepping, 1e-12):.1%}; waited "
          f"{waited / max(elapsed, 1e-12):.1%} of the time")


def angular_errors(predicted: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """1 - cos(angle) between the predicted unit directions and the true ``direction`` [B, 3],
    one per event ([B])."""
    return 1 - (predicted * direction.to(predicted.dtype)).sum(-1)


def angular_loss(predicted: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """:func:`angular_errors` averaged over the events."""
    return angular_errors(predicted, direction).mean()
