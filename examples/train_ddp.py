#!/usr/bin/env python3
"""Data-parallel training from shardify under torchrun, preemptible and elastic.

    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py DATASET \\
        --checkpoint ckpt.pt [--resume] [--epochs 1] [--batch-events 256 | --max-tokens T]
        [--resident]

The same command line starts a job and restarts it after a preemption: with ``--resume`` it
continues from ``--checkpoint`` when there is one, and ``--epochs`` counts the epochs done
before, too.

Every rank builds ``shardify.Loader(DATASET, ...)`` with nothing about ranks: rank and world
come from torch.distributed, and ``drop_last`` (on by default with several ranks) gives every
rank the same number of batches, so no rank waits forever in the last all-reduce. The model is
``train_torch.py``'s DeepSets, wrapped in DistributedDataParallel (gloo on CPUs, NCCL on GPUs).

``--max-tokens T`` batches events of similar DOM count instead of ``--batch-events``
(``group_by_length=max_doms, length_of="doms", max_tokens=T``, as ``predict.py``): each
padded batch holds at most T DOM rows, so the ranks of one step get different numbers of
events. The loss is ``shardify.distributed.event_mean`` of the per-event losses, which
weighs every event of the step the same once DDP averaged the ranks' gradients (a mean per
rank would weigh an event of a small batch more).

**Preemption.** On SIGTERM (what Slurm sends before it kills a job: ``sbatch
--signal=B:TERM@120 --requeue``, see the README) every rank finishes its step; the ranks agree
at the next step boundary (an all-reduce of the flag) to stop together, rank 0 writes model,
optimiser and ``loader.state_dict()`` atomically to ``--checkpoint``, and the job exits.
``--resume`` continues after the last step trained, at any world size: the loader's state
holds the global position (batches consumed by all ranks together), and the ranks of the new
world deal the rest of the epoch among themselves. A checkpoint is also written every
``--checkpoint-every`` steps and at the end.

``--record DIR`` appends, per rank, one line per trained batch (epoch, then its event ids) to
``DIR/rank-R.txt``: what the tests compare with the sampler's order. Collectives time out
after ``--timeout`` seconds, so a rank that waits for a batch another rank never gets fails
the job instead of hanging it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time

import shardify
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distributed_exit import exit_without_finalising  # noqa: E402
from shardify.distributed import event_mean  # noqa: E402
from train_torch import DeepSets, direction, normalise  # noqa: E402


class Preemption:
    """Remembers a SIGTERM; the ranks agree on it at step boundaries."""

    def __init__(self) -> None:
        self.signalled = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.signalled = True

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank was signalled (a collective: every rank calls it each step)."""
        flag = torch.tensor([int(self.signalled)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--epochs", type=int, default=1,
                    help="train until this many epochs are done (counting those before a "
                         "--resume: the same command line restarts a requeued job)")
    ap.add_argument("--batch-events", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="batches of similar DOM count within T padded DOM rows, instead of "
                         "--batch-events")
    ap.add_argument("--max-doms", type=int, default=64)
    ap.add_argument("--pulses-per-dom", type=int, default=4)
    ap.add_argument("--resident", action="store_true")
    ap.add_argument("--device", default="auto", help="auto (a GPU per rank when there are), cpu")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--checkpoint-every", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds a collective may wait before the job fails")
    ap.add_argument("--record", default=None, help="directory for per-rank batch records")
    ap.add_argument("--step-delay", type=float, default=0.0,
                    help="seconds of extra work per step (to test preemption on tiny data)")
    args = ap.parse_args()

    preemption = Preemption()  # before anything slow: a SIGTERM may come at any time
    use_gpu = args.device != "cpu" and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if use_gpu else "gloo",
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

    grouped = {} if args.max_tokens is None else dict(
        max_tokens=args.max_tokens, group_by_length=args.max_doms, length_of="doms")
    loader = shardify.Loader(args.dataset, batch_events=args.batch_events, layout="padded",
                             max_doms=args.max_doms, pulses_per_dom=args.pulses_per_dom,
                             device=device, resident=args.resident, seed=0, **grouped)
    assert (loader.rank, loader.world) == (rank, world), "rank and world from torch.distributed"
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = nn.parallel.DistributedDataParallel(
        DeepSets(4 + 3 * args.pulses_per_dom).to(device),
        device_ids=[local_rank] if use_gpu else None)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if args.resume and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, map_location=device)
        model.module.load_state_dict(saved["model"])
        optimiser.load_state_dict(saved["optimiser"])
        loader.load_state_dict(saved["loader"])
        if rank == 0:
            print(f"resumed at epoch {loader.epoch}, global batch "
                  f"{saved['loader']['global_batches']} (saved at world "
                  f"{saved['loader']['world']}, now {world})", flush=True)

    def checkpoint() -> None:
        if rank == 0:
            state = {"model": model.module.state_dict(), "optimiser": optimiser.state_dict(),
                     "loader": loader.state_dict()}
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
        dist.barrier()

    record = None
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        record = open(os.path.join(args.record, f"rank-{rank}.txt"), "a")
    steps = events = 0
    started = time.perf_counter()
    stopped = False
    while loader.epoch < args.epochs and not stopped:
        epoch = loader.epoch
        for batch in loader:
            features = normalise(batch["dom_features"], args.pulses_per_dom)
            mask = batch["dom_mask"].to(features.dtype)
            target = direction(batch["event_azimuth"], batch["event_zenith"]).to(features.dtype)
            loss = event_mean(1 - (model(features, mask) * target).sum(-1))
            optimiser.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients: every rank takes part
            optimiser.step()
            if args.step_delay:
                time.sleep(args.step_delay)
            steps += 1
            events += batch["event_id"].shape[0]
            if record is not None:
                ids = " ".join(map(str, batch["event_id"].tolist()))
                record.write(f"{epoch} {ids}\n")
                record.flush()
            del batch
            if preemption.agreed(device):
                stopped = True
                break  # before the next batch: the state counts only trained batches
            if steps % args.checkpoint_every == 0:
                checkpoint()
    checkpoint()
    elapsed = time.perf_counter() - started
    if rank == 0:
        why = "preempted (SIGTERM): checkpointed" if stopped else "done"
        print(f"rank 0 of {world}: {steps} steps, {events} events in {elapsed:.1f} s "
              f"({events * world / elapsed:,.0f} events/s over all ranks); {why}", flush=True)
    if record is not None:
        record.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_finalising()
