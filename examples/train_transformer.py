#!/usr/bin/env python3
"""Train a transformer on a shardify dataset: each event's pulses as a sequence, as the
Kaggle "IceCube - Neutrinos in Deep Ice" top solutions fed them.

    python examples/train_transformer.py DATASET [--epochs 1] [--device auto]
           [--batch-events 256] [--max-pulses 256] [--keep non_auxiliary_first]
           [--width 128] [--heads 8] [--layers 4] [--group-by-length [--max-tokens T]]
           [--warmup 3] [--checkpoint ckpt.pt] [--checkpoint-every 200] [--resume]
           [--stop-after N]

Each batch becomes the model's input on its device, with torch operations, in one call of
``shardify.transforms.pulse_sequences(batch, N, keep=..., standardize="graphnet")``:
``time_ordered`` (each event's pulses in time order, at most N of them, non-auxiliary first
by default), ``pulse_features`` (x, y, z, time, charge, auxiliary, scaled as GraphNeT's
IceCubeKaggle) and ``pad_pulses`` (a ``[B, N, 6]`` grid and its mask: every batch one
shape). With ``--group-by-length`` the loader batches events of similar length
(``group_by_length=N``, as the top solutions batched theirs) and each batch is padded to
its longest event, rounded up to a multiple of 16: a third of the cells at window 16 with
the real statistics, in at most N / 16 shapes. ``--max-tokens T`` then cuts batches by a
budget of padded tokens instead of ``--batch-events`` (``max_tokens=T``): each grid holds at
most T cells (the loader counts each batch's longest event rounded up to 16,
``pad_to_multiple_of=16``, as the grids are padded), short events in big batches and long
ones in small, so the grids, and the memory a step takes, are nearly equal.

The model embeds each pulse, runs a transformer encoder over the event's pulses (the
padding masked out), averages the encoded pulses and reads out a unit direction; the loss
is 1 - cos(angle) to the direction from the event's azimuth and zenith. ``--width``,
``--heads`` and ``--layers`` size it (the 2nd place solution's encoders were some 192 wide
and 8-12 deep; the defaults are smaller).

It prints events/s, the time waiting for data and the adapter's share of each step, as
train_dynedge.py does (examples/adapted_training.py), and the share of the grids' cells
that hold pulses. Checkpoints hold the model, the optimiser and ``loader.state_dict()``, as
train_torch.py's.
"""

from __future__ import annotations

import argparse

import adapted_training
import torch
from adapted_training import angular_loss
from shardify.torch_geometric import direction
from shardify.transforms import pulse_sequences
from torch import nn


class PulseTransformer(nn.Module):
    """Each pulse's features embedded, a transformer encoder over an event's pulses (the
    padding masked), their mean, a direction head."""

    def __init__(self, features: int = 6, width: int = 128, heads: int = 8, layers: int = 4):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(features, width), nn.GELU(),
                                   nn.Linear(width, width))
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 3)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``features`` ``[B, L, F]``, ``mask`` ``[B, L]`` (True where a pulse is): ``[B, 3]``
        unit vectors."""
        # An event without pulses would mask every key of its row: attention over no key is
        # NaN in torch before 2.5 (2.5 made it zeros, pytorch/pytorch#131060), so its first
        # (padding) slot stays visible; the mean below leaves it out.
        visible = mask.clone()
        visible[:, 0] = True
        encoded = self.encoder(self.embed(features), src_key_padding_mask=~visible)
        weights = mask.to(encoded.dtype)[..., None]
        pooled = (encoded * weights).sum(1) / weights.sum(1).clamp(min=1)
        return nn.functional.normalize(self.head(pooled), dim=1)


#: What grids of batches grouped by length are rounded up to (``--group-by-length``).
PAD_TO_MULTIPLE_OF = 16


class Sequences:
    """Batches as the model's input: the padded features, their mask and the directions,
    padded to ``max_pulses`` or, ``to_longest``, to each batch's longest event (rounded up
    to :data:`PAD_TO_MULTIPLE_OF`); counts the cells and the pulses in them (on the device:
    no host read per batch)."""

    def __init__(self, max_pulses: int, keep: str, to_longest: bool,
                 pad_to_multiple_of: int | None):
        self.max_pulses, self.keep, self.to_longest = max_pulses, keep, to_longest
        self.pad_to_multiple_of = pad_to_multiple_of
        self.cells = self.largest = 0
        self.pulses: torch.Tensor | int = 0

    def __call__(self, batch: dict, epoch: int) -> dict:
        grid = pulse_sequences(
            batch, self.max_pulses, keep=self.keep, standardize="graphnet", epoch=epoch,
            padding="longest" if self.to_longest else "length",
            pad_to_multiple_of=self.pad_to_multiple_of)
        mask = grid["pulse_mask"]
        self.cells += mask.numel()
        self.largest = max(self.largest, mask.numel())
        self.pulses = self.pulses + grid["event_pulses"].sum()
        return {"features": grid["pulse_features"], "mask": mask,
                "direction": direction(grid["event_azimuth"], grid["event_zenith"])}

    def fill(self) -> float:
        """The pulses over the cells of every grid made."""
        return float(self.pulses) / max(self.cells, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    adapted_training.add_arguments(
        ap, lr=3e-4, max_pulses_help="pulses kept per event, the sequences' padded length")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--group-by-length", action="store_true",
                    help="batches of events of similar length, each padded to its longest")
    ap.add_argument("--max-tokens", type=int,
                    help="with --group-by-length: batches cut by a budget of padded tokens "
                         "(events x longest) instead of --batch-events")
    args = ap.parse_args()
    if args.max_pulses < 1:
        raise SystemExit("--max-pulses must be at least 1: it is the sequences' length")
    if args.max_tokens is not None and not args.group_by_length:
        raise SystemExit("--max-tokens bounds batches grouped by length: add --group-by-length")

    grouping = {"group_by_length": args.max_pulses} if args.group_by_length else {}
    if args.max_tokens is not None:
        # The budget counts the grids as they are padded: rounded up.
        grouping.update(max_tokens=args.max_tokens, pad_to_multiple_of=PAD_TO_MULTIPLE_OF)
    loader = adapted_training.labelled_loader(args, **grouping)
    device = loader.device
    model = PulseTransformer(width=args.width, heads=args.heads, layers=args.layers).to(device)
    optimiser, saved = adapted_training.optimiser_and_checkpoints(args, model, loader)
    multiple = PAD_TO_MULTIPLE_OF if args.group_by_length else None
    within = "" if args.max_tokens is None else f" within {args.max_tokens} padded tokens"
    if not args.group_by_length:
        padded = f"pulses padded to {args.max_pulses}"
    else:
        padded = (f"batches of similar length{within}, each padded to its longest (a "
                  f"multiple of {multiple}, at most {args.max_pulses})")
    print(f"{len(loader.dataset)} events, {len(loader)} batches per epoch, on {device}; "
          f"{padded}")
    sequences = Sequences(args.max_pulses, args.keep, args.group_by_length, multiple)

    def loss_of(inputs: dict) -> torch.Tensor:
        return angular_loss(model(inputs["features"], inputs["mask"]), inputs["direction"])

    adapted_training.train(loader, sequences, loss_of, lambda inputs: inputs["mask"].shape[0],
                           optimiser, args, saved.save, "pulse_sequences")
    print(f"padding: {sequences.fill():.1%} of the grids' cells hold pulses; "
          f"the largest grid {sequences.largest} cells")


if __name__ == "__main__":
    main()
