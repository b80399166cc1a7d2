#!/usr/bin/env python3
"""Train train_dynedge.py's DynEdge-shaped GNN with PyTorch Lightning, the way GraphNeT's
``Model.fit`` does: ``shardify.torch_geometric.GraphLoader`` hands the ``Trainer`` to_pyg
graphs (GraphNeT's features and kNN edges), for training and for validation.

    python examples/train_lightning.py DATASET [--epochs 1] [--devices 1]
           [--accelerator auto] [--batch-events 256 | --pulse-budget P] [--max-pulses 256]
           [--knn 8]
           [--width 1.0] [--val-fraction 0.05] [--checkpoint-dir DIR]
           [--checkpoint-every 200] [--resume] [--stop-after N]

A held-out ``--val-fraction`` of the events (``Dataset.split``, no second conversion) is
validated at every epoch's end, in stored order. With ``--devices N`` (N > 1) Lightning runs
DDP: the loaders made here, before its process groups start, find their rank when Lightning
first uses them, so each rank trains on its share. ``--pulse-budget P`` batches training
events by a budget of nodes instead (``Loader(max_pulses=P, pulse_cap=MAX_PULSES)``: each
event counts the pulses its graph keeps, and a GNN's memory grows with its nodes), so the
ranks of one step get different numbers of events: the training loss is
``shardify.distributed.event_mean`` of the per-event errors, which weighs every event of the
step the same once DDP averaged the ranks' gradients, and each epoch has its own number of
batches, which Lightning reads anew at every epoch (``reload_dataloaders_every_n_epochs=1``;
else it would stop every epoch at the first one's count). Lightning checkpoints into
``--checkpoint-dir`` every ``--checkpoint-every`` steps (the model, the optimiser, its loops
and the loader's ``state_dict``); ``--resume`` continues from the latest one, mid-epoch,
with exactly the batches that were left. ``--stop-after N`` ends the process after N
steps, as a preemption would, to try ``--resume``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import lightning
import shardify
import torch
from adapted_training import angular_errors
from distributed_exit import exit_without_finalising
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from shardify.distributed import event_mean
from shardify.torch_geometric import GraphLoader
from train_dynedge import DynEdge


class DirectionModel(lightning.LightningModule):
    """DynEdge predicting the unit direction; the loss is 1 - cos(angle)."""

    def __init__(self, knn: int, width: float, lr: float):
        super().__init__()
        self.save_hyperparameters()
        self.net = DynEdge(6, k=knn, width=width)
        self.lr = lr
        self.events_trained = 0

    def errors(self, graphs) -> torch.Tensor:
        return angular_errors(self.net(graphs), graphs.direction)

    def training_step(self, graphs, index: int) -> torch.Tensor:
        errors = self.errors(graphs)
        # Logged as this batch's mean with its batch_size: Lightning's epoch value adds up
        # mean times batch_size and the batch sizes over the steps and, with sync_dist, over
        # the ranks, so it is the mean over every event even when the ranks hold different
        # numbers (a budget's batches). Without batch_size it guesses the size from the
        # graphs wrong, and the value is off (the example test catches it).
        self.log("train_loss", errors.mean(), batch_size=graphs.num_graphs, on_epoch=True,
                 on_step=False, sync_dist=True)
        self.events_trained += graphs.num_graphs
        return event_mean(errors)

    def validation_step(self, graphs, index: int) -> None:
        self.log("val_loss", self.errors(graphs).mean(), batch_size=graphs.num_graphs,
                 sync_dist=True)

    def on_train_epoch_end(self) -> None:
        metrics = self.trainer.callback_metrics
        if self.trainer.is_global_zero:
            losses = ", ".join(f"{name} {float(metrics[name]):.6f}"
                               for name in ("train_loss", "val_loss") if name in metrics)
            print(f"epoch {self.current_epoch}: {losses}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class StopAfter(Callback):
    """Ends the process before step ``steps + 1``, once step ``steps``'s checkpoint is
    written, as a preemption would."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_train_batch_start(self, trainer, module, batch, index) -> None:
        if trainer.global_step >= self.steps:
            print(f"stopped after {trainer.global_step} steps, "
                  f"{module.events_trained} events", flush=True)
            os._exit(0)


def latest_checkpoint(directory: Path) -> str | None:
    """The checkpoint of the most steps in ``directory``, if any."""
    saved = [(torch.load(p, map_location="cpu", weights_only=False)["global_step"], p)
             for p in directory.glob("*.ckpt")] if directory.is_dir() else []
    return str(max(saved)[1]) if saved else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "gpu"])
    ap.add_argument("--batch-events", type=int, default=256)
    ap.add_argument("--pulse-budget", type=int, default=None,
                    help="training batches of at most this many nodes (each event's pulses cut "
                         "to --max-pulses), instead of --batch-events")
    ap.add_argument("--max-pulses", type=int, default=256, help="pulses kept per event")
    ap.add_argument("--knn", type=int, default=8)
    ap.add_argument("--width", type=float, default=1.0,
                    help="scales every layer (1.0: GraphNeT's DynEdge sizes)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    ap.add_argument("--checkpoint-every", type=int, default=200)
    ap.add_argument("--resume", action="store_true",
                    help="continue from the latest checkpoint in --checkpoint-dir, if any")
    ap.add_argument("--stop-after", type=int, default=None)
    args = ap.parse_args()

    train, val = shardify.Dataset(args.dataset).split(args.val_fraction, seed=0)
    if not train.labels:
        raise SystemExit(f"{args.dataset} has no labels (a test split): nothing to train on")
    device = "cpu" if args.accelerator == "cpu" else "auto"
    graphs = dict(standardize="graphnet", knn=args.knn, max_pulses=args.max_pulses)
    budget = {} if args.pulse_budget is None else {"max_pulses": args.pulse_budget,
                                                   "pulse_cap": args.max_pulses}
    train_graphs = GraphLoader(
        shardify.Loader(train, batch_events=args.batch_events, device=device, **budget),
        **graphs)
    val_graphs = GraphLoader(
        shardify.Loader(val, batch_events=args.batch_events, shuffle=False, device=device),
        **graphs)
    callbacks: list[Callback] = [ModelCheckpoint(
        dirpath=args.checkpoint_dir, filename="{epoch}-{step}",
        every_n_train_steps=args.checkpoint_every, save_top_k=1)]
    if args.stop_after is not None:
        callbacks.append(StopAfter(args.stop_after))
    trainer = lightning.Trainer(
        max_epochs=args.epochs, accelerator=args.accelerator, devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto", callbacks=callbacks, logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        # A budget's epochs each have their own number of batches: Lightning reads it anew.
        reload_dataloaders_every_n_epochs=0 if args.pulse_budget is None else 1)
    resume = latest_checkpoint(args.checkpoint_dir) if args.resume else None
    if resume and trainer.is_global_zero:
        step = torch.load(resume, map_location="cpu", weights_only=False)["global_step"]
        print(f"resumed from {Path(resume).name} (step {step})", flush=True)
    model = DirectionModel(args.knn, args.width, args.lr)
    trainer.fit(model, train_graphs, val_graphs, ckpt_path=resume)
    print(f"rank {trainer.global_rank}: {model.events_trained} events trained in this run, "
          f"at step {trainer.global_step}", flush=True)
    if torch.distributed.is_initialized():
        # gloo can abort a rank in the interpreter's finalisation (distributed_exit.py).
        torch.distributed.destroy_process_group()
        del train_graphs, val_graphs  # dropping a loader joins its threads
        exit_without_finalising()


if __name__ == "__main__":
    main()
