#!/usr/bin/env python3
"""Predict every event's direction and write a Kaggle submission-shaped Parquet file.

    python examples/predict.py DATASET submission.parquet [--checkpoint ckpt.pt]
           [--batch-events 1024 | --max-tokens T] [--max-doms 64] [--pulses-per-dom 4]
    torchrun --standalone --nproc-per-node 4 examples/predict.py DATASET submission.parquet ...

The loader runs with ``shuffle=False``: every event exactly once over all ranks, in stored
order, the last partial batch kept (no padding with duplicates: ranks may get one batch more
or fewer, which inference does not mind). The ranks' predictions are gathered with
``shardify.distributed.gather_predictions`` and rank 0 writes one row per event,
``event_id, azimuth, zenith`` (radians, the Kaggle convention: azimuth in [0, 2 pi), zenith in
[0, pi]), sorted by event id, after checking the ids against the dataset's own. The model is
``train_torch.py``'s DeepSets, with the weights of ``--checkpoint`` (written by
``train_torch.py`` or ``train_ddp.py``); without one it is untrained (a smoke test).

``--max-tokens T`` batches events of similar DOM count instead of ``--batch-events``
(``group_by_length=max_doms, length_of="doms", max_tokens=T``): each batch's padded grid
holds at most T DOM rows, so the model computes on little padding. Inference sees each event
once either way, and each event's prediction does not depend on its batch, so the file is
the same.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import shardify
import torch
import torch.distributed as dist
from shardify.distributed import gather_predictions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distributed_exit import exit_without_finalising  # noqa: E402
from train_torch import DeepSets, normalise  # noqa: E402


def angles(unit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Azimuth in [0, 2 pi) and zenith in [0, pi] of unit vectors ``[N, 3]``."""
    azimuth = torch.remainder(torch.atan2(unit[:, 1], unit[:, 0]), 2 * math.pi)
    zenith = torch.arccos(unit[:, 2].clamp(-1.0, 1.0))
    return azimuth, zenith


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("output", help="the Parquet file to write (event_id, azimuth, zenith)")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--batch-events", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="batches of similar DOM count within T padded DOM rows, instead of "
                         "--batch-events")
    ap.add_argument("--max-doms", type=int, default=64)
    ap.add_argument("--pulses-per-dom", type=int, default=4)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    use_gpu = args.device != "cpu" and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_gpu:
        torch.cuda.set_device(local_rank)  # NCCL's and the loader's device ("auto" follows it)
    device = torch.device("cuda", local_rank) if use_gpu else torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if use_gpu else "gloo")
    grouped = {} if args.max_tokens is None else dict(
        max_tokens=args.max_tokens, group_by_length=args.max_doms, length_of="doms")
    loader = shardify.Loader(args.dataset, batch_events=args.batch_events, layout="padded",
                             max_doms=args.max_doms, pulses_per_dom=args.pulses_per_dom,
                             shuffle=False, device=device, **grouped)
    model = DeepSets(4 + 3 * args.pulses_per_dom).to(device).eval()
    if args.checkpoint:
        model.load_state_dict(torch.load(args.checkpoint, map_location=device)["model"])
    ids, azimuths, zeniths = [], [], []
    with torch.no_grad():
        for batch in loader:
            unit = model(normalise(batch["dom_features"], args.pulses_per_dom),
                         batch["dom_mask"].to(torch.float32))
            azimuth, zenith = angles(unit.double())
            ids.append(batch["event_id"].clone())
            azimuths.append(azimuth)
            zeniths.append(zenith)
    empty = torch.empty(0, dtype=torch.float64, device=device)
    event_id, azimuth, zenith = gather_predictions(
        torch.cat(ids) if ids else torch.empty(0, dtype=torch.int64, device=device),
        torch.cat(azimuths) if azimuths else empty, torch.cat(zeniths) if zeniths else empty)
    if loader.rank == 0:
        import pyarrow as pa
        import pyarrow.parquet as pq

        order = torch.argsort(event_id)
        ids_out, azimuth_out, zenith_out = (t[order].cpu().numpy()
                                            for t in (event_id, azimuth, zenith))
        expected = np.sort(loader.dataset.event_ids())
        if not np.array_equal(ids_out, expected):
            raise SystemExit(f"predicted {len(ids_out)} events, the dataset holds "
                             f"{len(expected)}: they differ")
        table = pa.table({"event_id": ids_out, "azimuth": azimuth_out, "zenith": zenith_out})
        pq.write_table(table, args.output + ".tmp")
        os.replace(args.output + ".tmp", args.output)
        print(f"{len(ids_out)} events from {loader.world} rank(s) -> {args.output}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_finalising()
