#!/usr/bin/env python3
"""Train a small direction model on a shardify dataset: the loader inside a real PyTorch loop.

    python examples/train_torch.py DATASET [--epochs 1] [--device auto] [--batch-events 256]
           [--resident] [--checkpoint ckpt.pt] [--checkpoint-every 200] [--resume]
           [--stop-after N]

The model is DeepSets over the padded layout: a per-DOM MLP on (x, y, z, pulse count and
the first K pulses' time, charge, auxiliary), a masked mean over each event's DOMs, and an
MLP to a unit vector; the loss is 1 - cos(angle) to the true direction from azimuth and
zenith. It checkpoints the model, the optimiser and ``loader.state_dict()`` together, so
``--resume`` continues after the last batch trained on (not the last prefetched one).

With ``--resident`` the whole dataset is held on the device and each batch is gathered
there (``shardify.Loader(..., resident=True)``); the checkpoints are the same either way, so
a streaming run may resume a resident one and back.

It prints events/s and the fraction of time the training waited for data: on a GPU, the
time the device sat idle between steps (CUDA events), on the CPU the time spent in next().
"""

from __future__ import annotations

import argparse
import math
import time

import checkpoints
import shardify
import torch
from torch import nn


class DeepSets(nn.Module):
    """Per-DOM encoder, masked mean over DOMs, direction head."""

    def __init__(self, features: int, width: int = 128):
        super().__init__()
        self.dom = nn.Sequential(nn.Linear(features, width), nn.GELU(),
                                 nn.Linear(width, width), nn.GELU())
        self.head = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, 3))

    def forward(self, doms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        encoded = self.dom(doms) * mask[..., None]
        pooled = encoded.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return nn.functional.normalize(self.head(pooled), dim=-1)


def normalise(features: torch.Tensor, pulses_per_dom: int) -> torch.Tensor:
    """Scales the padded layout's raw features to order one (metres, ns, p.e.)."""
    xyz = features[..., :3] / 500.0
    count = torch.log1p(features[..., 3:4])
    pulses = features[..., 4:].reshape(*features.shape[:2], pulses_per_dom, 3)
    time_ = (pulses[..., 0] - 1.0e4) / 3.0e3
    charge = torch.log1p(pulses[..., 1].clamp(min=0))
    auxiliary = pulses[..., 2]
    return torch.cat([xyz, count, time_, charge, auxiliary], dim=-1)


def direction(azimuth: torch.Tensor, zenith: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.cos(azimuth) * torch.sin(zenith),
                        torch.sin(azimuth) * torch.sin(zenith), torch.cos(zenith)], dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-events", type=int, default=256)
    ap.add_argument("--max-doms", type=int, default=128)
    ap.add_argument("--pulses-per-dom", type=int, default=4)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--resident", action="store_true",
                    help="hold the dataset on the device; gather batches there")
    ap.add_argument("--lr", type=float, default=1e-3)
    checkpoints.add_arguments(ap)
    args = ap.parse_args()

    loader = shardify.Loader(args.dataset, batch_events=args.batch_events, layout="padded",
                             max_doms=args.max_doms, pulses_per_dom=args.pulses_per_dom,
                             device=args.device, workers=args.workers, seed=0,
                             resident=args.resident)
    device = loader.device
    if not loader.dataset.labels:
        raise SystemExit(f"{args.dataset} has no labels (a test split): nothing to train on")
    model = DeepSets(4 + 3 * args.pulses_per_dom).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr)
    saved = checkpoints.Checkpoints(args.checkpoint, model, optimiser, loader)
    if args.resume:
        saved.resume(device)
    checkpoint = saved.save

    on_gpu = device.type == "cuda"
    print(f"{len(loader.dataset)} events, {len(loader)} batches per epoch, on {device}"
          + ("" if on_gpu else f" ({loader.placement_reason})"))
    events = steps = 0
    waited = 0.0
    first_wait: float | None = None
    gpu_idle_ms = 0.0
    idle_from = None  # a CUDA event recorded when the previous step's work was queued
    started = time.perf_counter()
    first_epoch = loader.epoch
    for _ in range(args.epochs):
        losses = []
        batches = iter(loader)
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            if first_wait is None:
                # The run's first batch: the pipeline's start, or a resident loader's load of
                # the dataset onto its device; reported apart from the steady waits.
                first_wait = time.perf_counter() - asked
            else:
                waited += time.perf_counter() - asked
            if batch is None:
                break
            if on_gpu:
                step_start = torch.cuda.Event(enable_timing=True)
                step_start.record()
                if idle_from is not None:
                    # Stream order: idle_from (last step's end) then step_start; the gap
                    # between them is device time spent waiting for the next batch.
                    idle_from.synchronize()
                    step_start.synchronize()
                    gpu_idle_ms += idle_from.elapsed_time(step_start)
            features = normalise(batch["dom_features"], args.pulses_per_dom)
            mask = batch["dom_mask"].to(features.dtype)
            target = direction(batch["event_azimuth"], batch["event_zenith"]).to(features.dtype)
            predicted = model(features, mask)
            loss = (1 - (predicted * target).sum(-1)).mean()
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            if on_gpu:
                idle_from = torch.cuda.Event(enable_timing=True)
                idle_from.record()
            events += batch["event_id"].shape[0]
            steps += 1
            del batch
            if steps % 50 == 0:
                losses.append(loss.item())
            if steps % args.checkpoint_every == 0:
                checkpoint()
            if args.stop_after is not None and steps >= args.stop_after:
                break
        if args.stop_after is not None and steps >= args.stop_after:
            break
        mean = sum(losses) / len(losses) if losses else float("nan")
        print(f"epoch {loader.epoch - 1}: mean loss {mean:.4f} "
              f"(mean angular error ~{math.degrees(math.acos(max(-1.0, 1 - mean))):.1f} deg)")
    if on_gpu:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    checkpoint()
    print(f"{steps} steps, {events} events in {elapsed:.2f} s: {events / elapsed:,.0f} events/s "
          f"(from epoch {first_epoch})")
    if on_gpu:
        print(f"GPU waited for data {gpu_idle_ms / 1e3 / elapsed:.1%} of the time")
    loaded = " (the dataset loaded onto the device)" if loader.resident else ""
    print(f"time in next() waiting for data: {waited / elapsed:.1%}, the first batch apart: "
          f"{first_wait or 0.0:.2f} s{loaded}")


if __name__ == "__main__":
    main()
