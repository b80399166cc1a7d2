"""A resident batch's gather as a fixed sequence of torch operations.

This is the reference (and the CPU path): every size it needs comes from the epoch plan on
the host, so no operation's output shape depends on the data on the device. There is no
``.item()``, no ``nonzero``, no boolean-mask indexing, and ``repeat_interleave`` is always
given its ``output_size``. Run with the columns on torch's ``meta`` device it goes through,
which proves it: a data-dependent shape cannot be computed there.

The batch is written into preallocated output tensors (``out=`` wherever torch offers it),
the same sections, dtypes and values as the streaming loader's batch for the same plan.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .columns import Columns


@dataclasses.dataclass(frozen=True)
class BatchSizes:
    """Every size a batch's gather needs, known on the host from the epoch plan."""

    events: int
    """B: events in the batch."""
    doms: int
    """D: DOMs of those events."""
    pulses: int
    """P: pulses of those events."""
    width: int
    """M (padded layout): DOM slots per event, the widest event's DOM count capped at
    ``max_doms``; 0 for the packed layout."""


@dataclasses.dataclass(frozen=True)
class Located:
    """Where a batch's events are in the columns, and where they go in the batch."""

    dom_start: torch.Tensor
    """``[B]`` each event's first DOM in the columns (int64)."""
    dom_counts: torch.Tensor
    """``[B]`` its DOMs (int64)."""
    pulse_start: torch.Tensor
    """``[B]`` its first pulse in the columns (int64)."""
    pulse_counts: torch.Tensor
    """``[B]`` its pulses (int64)."""
    dom_at: torch.Tensor
    """``[B]`` its first DOM in the batch (int64; exclusive cumulative DOM counts)."""
    pulse_at: torch.Tensor
    """``[B]`` its first pulse in the batch (int64)."""


def locate(c: Columns, events: torch.Tensor) -> Located:
    """Each event's DOM and pulse ranges in the columns and in the batch."""
    import torch

    offsets = c.event_dom_offsets
    dom_start = offsets.index_select(0, events).long()
    dom_end = offsets.index_select(0, events + 1).long()
    pulse_start = c.dom_pulse_offsets.index_select(0, dom_start).long()
    pulse_end = c.dom_pulse_offsets.index_select(0, dom_end).long()
    dom_counts, pulse_counts = dom_end - dom_start, pulse_end - pulse_start
    return Located(
        dom_start=dom_start,
        dom_counts=dom_counts,
        pulse_start=pulse_start,
        pulse_counts=pulse_counts,
        dom_at=torch.cumsum(dom_counts, 0) - dom_counts,
        pulse_at=torch.cumsum(pulse_counts, 0) - pulse_counts,
    )


def _batch_indexes(start: torch.Tensor, at: torch.Tensor, counts: torch.Tensor,
                   total: int) -> torch.Tensor:
    """``[total]``: for each batch position of a level (DOMs or pulses), the column index it
    comes from: position ``at[e] + k`` takes ``start[e] + k``."""
    import torch

    shift = torch.repeat_interleave(start - at, counts, output_size=total)
    return shift.add_(torch.arange(total, device=start.device))


def gather_headers(c: Columns, events: torch.Tensor, out: dict[str, torch.Tensor]) -> None:
    """``event_id`` and, when the dataset has them, the labels."""
    import torch

    torch.index_select(c.event_id, 0, events, out=out["event_id"])
    if c.event_azimuth is not None and c.event_zenith is not None:
        torch.index_select(c.event_azimuth, 0, events, out=out["event_azimuth"])
        torch.index_select(c.event_zenith, 0, events, out=out["event_zenith"])


def gather_packed(c: Columns, events: torch.Tensor, n: BatchSizes,
                  out: dict[str, torch.Tensor]) -> None:
    """The packed layout: headers, CSR offsets rebased to the batch, DOM and pulse columns,
    and ``dom_position`` when ``out`` has it."""
    import torch

    gather_headers(c, events, out)
    where = locate(c, events)
    event_doms = out["event_dom_offsets"]
    event_doms[:1].zero_()
    torch.cumsum(where.dom_counts, 0, dtype=torch.int32, out=event_doms[1:])
    doms = _batch_indexes(where.dom_start, where.dom_at, where.dom_counts, n.doms)
    sensors = torch.index_select(c.dom_sensor_id, 0, doms, out=out["dom_sensor_id"])
    if "dom_position" in out:
        torch.index_select(c.sensor_position, 0, sensors.int(), out=out["dom_position"])
    # A DOM's first pulse in the batch: its first pulse in the columns, shifted as its
    # event's pulses are.
    pulse_shift = torch.repeat_interleave(where.pulse_start - where.pulse_at, where.dom_counts,
                                          output_size=n.doms)
    dom_pulses = out["dom_pulse_offsets"]
    torch.sub(c.dom_pulse_offsets.index_select(0, doms), pulse_shift, out=dom_pulses[:n.doms])
    dom_pulses[n.doms:].fill_(n.pulses)
    pulses = _batch_indexes(where.pulse_start, where.pulse_at, where.pulse_counts, n.pulses)
    for name in ("pulse_time", "pulse_charge", "pulse_auxiliary"):
        torch.index_select(getattr(c, name), 0, pulses, out=out[name])


def gather_padded(c: Columns, events: torch.Tensor, n: BatchSizes, pulses_per_dom: int,
                  out: dict[str, torch.Tensor]) -> None:
    """The padded layout: headers, then ``dom_features`` rows ``[B * M + 1, 4 + 3K]`` and
    ``dom_mask`` ``[B * M + 1]`` (the batch's ``[B, M, ...]`` sections plus one spare row):
    every DOM of the batch is written, those past an event's first M to the spare row, so
    no count of kept DOMs is needed on the host."""
    import torch

    gather_headers(c, events, out)
    where = locate(c, events)
    width, device = n.width, events.device
    features, mask = out["dom_features"], out["dom_mask"]
    features.zero_()
    mask.zero_()
    doms = _batch_indexes(where.dom_start, where.dom_at, where.dom_counts, n.doms)
    slot = torch.arange(n.doms, device=device) - torch.repeat_interleave(
        where.dom_at, where.dom_counts, output_size=n.doms)
    event_of = torch.repeat_interleave(torch.arange(n.events, device=device), where.dom_counts,
                                       output_size=n.doms)
    spare = n.events * width
    row = torch.where(slot < width, event_of * width + slot, spare)
    first = c.dom_pulse_offsets.index_select(0, doms).long()
    count = c.dom_pulse_offsets.index_select(0, doms + 1).long() - first
    kept = torch.arange(pulses_per_dom, device=device)
    present = kept < count[:, None]  # [D, K]
    pulse = torch.where(present, first[:, None] + kept, 0)  # [D, K]
    values = torch.empty((n.doms, 4 + 3 * pulses_per_dom), dtype=torch.float32, device=device)
    sensors = c.dom_sensor_id.index_select(0, doms).int()
    values[:, :3] = c.sensor_position.index_select(0, sensors)
    values[:, 3] = count
    for column, name in enumerate(("pulse_time", "pulse_charge", "pulse_auxiliary")):
        taken = getattr(c, name)[pulse].to(torch.float32)
        values[:, 4 + column::3] = torch.where(present, taken, 0.0)
    features.index_copy_(0, row, values)
    mask.index_fill_(0, row, 1)
