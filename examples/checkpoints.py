"""Checkpointing shared by the training examples: the model, the optimiser and the loader's
``state_dict()`` saved together, atomically (a kill mid-write leaves the previous one)."""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``--checkpoint``, ``--checkpoint-every``, ``--resume`` and ``--stop-after``."""
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=200)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop after this many batches (checkpointed), e.g. to try --resume")


class Checkpoints:
    """Saves and restores (model, optimiser, loader) at ``path`` (None: never saves)."""

    def __init__(self, path: str | None, model: torch.nn.Module,
                 optimiser: torch.optim.Optimizer, loader: Any):
        self.path, self.model, self.optimiser, self.loader = path, model, optimiser, loader

    def resume(self, device: torch.device) -> None:
        """Restores all three from ``path``, which must exist; the loader continues after the
        last batch trained on, not the last prefetched."""
        if not self.path or not os.path.exists(self.path):
            raise SystemExit("--resume needs an existing --checkpoint")
        saved = torch.load(self.path, map_location=device)
        self.model.load_state_dict(saved["model"])
        self.optimiser.load_state_dict(saved["optimiser"])
        self.loader.load_state_dict(saved["loader"])
        print(f"resumed at epoch {self.loader.epoch}, batch {saved['loader']['batches_taken']}")

    def save(self) -> None:
        """Writes the three to ``path`` (a temporary file renamed over it)."""
        if self.path:
            torch.save({"model": self.model.state_dict(),
                        "optimiser": self.optimiser.state_dict(),
                        "loader": self.loader.state_dict()}, self.path + ".tmp")
            os.replace(self.path + ".tmp", self.path)
