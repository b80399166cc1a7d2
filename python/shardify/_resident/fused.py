"""The resident gather as a few Triton kernels: the GPU path.

Per packed batch, three launches: one program walks the batch's events (headers, each
event's DOM and pulse ranges, the batch's ``event_dom_offsets`` through a running cumulative
sum), then one kernel writes every DOM-level section and ``dom_pulse_offsets``, then one
kernel writes the three pulse-level columns. Per padded batch, two: the event walk, then one
kernel that writes every ``[B, M]`` slot of ``dom_features`` and ``dom_mask`` (zeros where
an event has fewer DOMs). A DOM or pulse finds its event by a binary search of the events'
batch offsets (at most ``ceil(log2 B)`` loads from a few hundred bytes that stay in cache),
so no index array the size of the batch is built. Sizes come from the plan, as for the
torch operations of :mod:`.gather`, which stay the reference these kernels are tested
against (with ``TRITON_INTERPRET=1`` the kernels run on CPU tensors, in CI).
"""

# No `from __future__ import annotations`: Triton's CPU interpreter before 3.2 (torch 2.5
# and older) takes a kernel parameter for a constexpr only where its annotation is
# `tl.constexpr` itself, not the string; annotations naming what only type checkers import
# are quoted instead.
from collections.abc import Callable
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .._kernels import compiled_for_any

if TYPE_CHECKING:
    import torch

    from .columns import Columns
    from .gather import BatchSizes

# A batch's sizes, and its slice of the epoch's events (at any element), are arguments that
# Triton would otherwise specialise on (a multiple of 16, or 1; a 16-byte aligned pointer):
# each new combination would compile the kernel again, in the first epochs, at a second or
# so each where Triton's cache is cold. So the kernels are compiled for any value of them.

#: Events, DOMs or pulses per program.
EVENT_BLOCK = 256
ITEM_BLOCK = 1024


@triton.jit
def _owner(batch_at, q, events, STEPS: tl.constexpr):
    """For each item ``q``, the last event ``e < events`` with ``batch_at[e] <= q``: the
    event owning batch position ``q`` (``batch_at`` ascending from 0; empty events are
    skipped since a later event with the same start wins)."""
    lo = tl.zeros_like(q)
    hi = lo + (events - 1)
    for _ in tl.static_range(STEPS):
        mid = (lo + hi + 1) // 2
        go = tl.load(batch_at + mid) <= q
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    return lo


@triton.jit(**compiled_for_any(values=["n_events"], alignments=["events_ptr"]))
def _events_kernel(events_ptr, n_events, event_id, azimuth, zenith, event_dom_offsets,
                   dom_pulse_offsets, id_out, azimuth_out, zenith_out, offsets_out, scratch,
                   LABELS: tl.constexpr, OFFSETS: tl.constexpr, BLOCK: tl.constexpr):
    """One program: the batch's headers, and per event (in ``scratch``, int64 ``[5, B]``) its
    first DOM in the batch, the shift from batch to column DOM indexes, its first pulse in the
    batch, the same shift for pulses, and its DOM count; with ``OFFSETS`` the batch's
    ``event_dom_offsets`` (int32 ``[B + 1]``)."""
    dom_carry = tl.zeros((), dtype=tl.int64)
    pulse_carry = tl.zeros((), dtype=tl.int64)
    if OFFSETS:
        tl.store(offsets_out, dom_carry.to(tl.int32))
    for start in range(0, n_events, BLOCK):
        i = start + tl.arange(0, BLOCK)
        live = i < n_events
        e = tl.load(events_ptr + i, mask=live, other=0)
        tl.store(id_out + i, tl.load(event_id + e, mask=live), mask=live)
        if LABELS:
            tl.store(azimuth_out + i, tl.load(azimuth + e, mask=live), mask=live)
            tl.store(zenith_out + i, tl.load(zenith + e, mask=live), mask=live)
        d0 = tl.load(event_dom_offsets + e, mask=live, other=0).to(tl.int64)
        d1 = tl.load(event_dom_offsets + e + 1, mask=live, other=0).to(tl.int64)
        p0 = tl.load(dom_pulse_offsets + d0, mask=live, other=0).to(tl.int64)
        p1 = tl.load(dom_pulse_offsets + d1, mask=live, other=0).to(tl.int64)
        doms, pulses = d1 - d0, p1 - p0
        dom_end = tl.cumsum(doms, 0) + dom_carry
        pulse_end = tl.cumsum(pulses, 0) + pulse_carry
        dom_at, pulse_at = dom_end - doms, pulse_end - pulses
        n = n_events
        tl.store(scratch + i, dom_at, mask=live)
        tl.store(scratch + n + i, d0 - dom_at, mask=live)
        tl.store(scratch + 2 * n + i, pulse_at, mask=live)
        tl.store(scratch + 3 * n + i, p0 - pulse_at, mask=live)
        tl.store(scratch + 4 * n + i, doms, mask=live)
        if OFFSETS:
            tl.store(offsets_out + 1 + i, dom_end.to(tl.int32), mask=live)
        dom_carry += tl.sum(doms, 0)
        pulse_carry += tl.sum(pulses, 0)


@triton.jit(**compiled_for_any(values=["n_events", "n_doms", "n_pulses"]))
def _doms_kernel(scratch, n_events, n_doms, n_pulses, sensor_id, sensor_position,
                 dom_pulse_offsets, sensor_out, position_out, dom_pulses_out,
                 POSITIONS: tl.constexpr, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    """Every DOM of the batch: its sensor id (and position), and ``dom_pulse_offsets``
    rebased to the batch (``[D + 1]``, the last entry ``P``)."""
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = j < n_doms
    e = _owner(scratch, j, n_events, STEPS)
    d = j + tl.load(scratch + n_events + e)
    sensor = tl.load(sensor_id + d, mask=live, other=0)
    tl.store(sensor_out + j, sensor, mask=live)
    if POSITIONS:
        row = sensor.to(tl.int64) * 3
        for k in tl.static_range(3):
            value = tl.load(sensor_position + row + k, mask=live)
            tl.store(position_out + 3 * j + k, value, mask=live)
    first = tl.load(dom_pulse_offsets + d, mask=live, other=0).to(tl.int64)
    first -= tl.load(scratch + 3 * n_events + e)
    last = tl.zeros_like(j) + n_pulses
    tl.store(dom_pulses_out + j, tl.where(live, first, last).to(tl.int32), mask=j <= n_doms)


@triton.jit(**compiled_for_any(values=["n_events", "n_pulses"]))
def _pulses_kernel(scratch, n_events, n_pulses, time, charge, auxiliary, time_out,
                   charge_out, auxiliary_out, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    """Every pulse of the batch: time, charge and auxiliary flag."""
    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = q < n_pulses
    e = _owner(scratch + 2 * n_events, q, n_events, STEPS)
    p = q + tl.load(scratch + 3 * n_events + e)
    tl.store(time_out + q, tl.load(time + p, mask=live), mask=live)
    tl.store(charge_out + q, tl.load(charge + p, mask=live), mask=live)
    tl.store(auxiliary_out + q, tl.load(auxiliary + p, mask=live), mask=live)


@triton.jit(**compiled_for_any(values=["n_events", "width"]))
def _padded_kernel(scratch, n_events, width, sensor_id, sensor_position, dom_pulse_offsets,
                   time, charge, auxiliary, features, mask,
                   PULSES: tl.constexpr, BLOCK: tl.constexpr):
    """Every slot ``[B, M]`` of the padded layout: the DOM's x, y, z, pulse count and its
    first ``PULSES`` (time, charge, auxiliary), or zeros where the event has no such DOM."""
    FEATURES: tl.constexpr = 4 + 3 * PULSES
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = r < n_events * width
    e, slot = r // width, r % width
    doms = tl.load(scratch + 4 * n_events + e, mask=live, other=0)
    present = live & (slot < doms)
    d = tl.load(scratch + n_events + e, mask=live, other=0) + tl.load(
        scratch + e, mask=live, other=0) + slot
    row = tl.load(sensor_id + d, mask=present, other=0).to(tl.int64) * 3
    out = features + r * FEATURES
    for k in tl.static_range(3):
        xyz = tl.load(sensor_position + row + k, mask=present, other=0).to(tl.float32)
        tl.store(out + k, tl.where(present, xyz, 0.0), mask=live)
    p0 = tl.load(dom_pulse_offsets + d, mask=present, other=0).to(tl.int64)
    count = tl.load(dom_pulse_offsets + d + 1, mask=present, other=0).to(tl.int64) - p0
    tl.store(out + 3, tl.where(present, count.to(tl.float32), 0.0), mask=live)
    for k in tl.static_range(PULSES):
        has = present & (k < count)
        t = tl.load(time + p0 + k, mask=has, other=0).to(tl.float32)
        q = tl.load(charge + p0 + k, mask=has, other=0).to(tl.float32)
        a = tl.load(auxiliary + p0 + k, mask=has, other=0).to(tl.float32)
        tl.store(out + 4 + 3 * k, tl.where(has, t, 0.0), mask=live)
        tl.store(out + 5 + 3 * k, tl.where(has, q, 0.0), mask=live)
        tl.store(out + 6 + 3 * k, tl.where(has, a, 0.0), mask=live)
    tl.store(mask + r, present.to(tl.uint8), mask=live)


def _steps(events: int) -> int:
    """Binary-search steps that find one of ``events`` events."""
    return max(1, (events - 1).bit_length())


def _walk_events(c: "Columns", events: "torch.Tensor", n: "BatchSizes",
                 out: "dict[str, torch.Tensor]", offsets: bool) -> "torch.Tensor":
    """Runs the event walk; returns its scratch (int64 ``[5, B]``)."""
    import torch

    scratch = torch.empty((5, n.events), dtype=torch.int64, device=events.device)
    labels = c.event_azimuth is not None
    ids = out["event_id"]
    _events_kernel[(1,)](
        events, n.events, c.event_id,
        c.event_azimuth if labels else c.event_id, c.event_zenith if labels else c.event_id,
        c.event_dom_offsets, c.dom_pulse_offsets, ids,
        out["event_azimuth"] if labels else ids, out["event_zenith"] if labels else ids,
        out["event_dom_offsets"] if offsets else ids, scratch,
        LABELS=labels, OFFSETS=offsets, BLOCK=EVENT_BLOCK,
    )
    return scratch


def gather_packed(c: "Columns", events: "torch.Tensor", n: "BatchSizes",
                  out: "dict[str, torch.Tensor]") -> None:
    """The packed layout in three launches (see the module documentation)."""
    scratch = _walk_events(c, events, n, out, offsets=True)
    steps = _steps(n.events)
    positions = "dom_position" in out
    sensors = out["dom_sensor_id"]
    _doms_kernel[(triton.cdiv(n.doms + 1, ITEM_BLOCK),)](
        scratch, n.events, n.doms, n.pulses, c.dom_sensor_id, c.sensor_position,
        c.dom_pulse_offsets, sensors, out["dom_position"] if positions else sensors,
        out["dom_pulse_offsets"], POSITIONS=positions, STEPS=steps, BLOCK=ITEM_BLOCK,
    )
    if n.pulses:
        _pulses_kernel[(triton.cdiv(n.pulses, ITEM_BLOCK),)](
            scratch, n.events, n.pulses, c.pulse_time, c.pulse_charge,
            c.pulse_auxiliary.view(_uint8()), out["pulse_time"], out["pulse_charge"],
            out["pulse_auxiliary"].view(_uint8()), STEPS=steps, BLOCK=ITEM_BLOCK,
        )


def gather_padded(pulses_per_dom: int) -> Callable[
        ["Columns", "torch.Tensor", "BatchSizes", "dict[str, torch.Tensor]"], None]:
    """The padded layout's gather, keeping ``pulses_per_dom`` pulses per DOM, in two
    launches (see the module documentation)."""

    def gather(c: "Columns", events: "torch.Tensor", n: "BatchSizes",
               out: "dict[str, torch.Tensor]") -> None:
        scratch = _walk_events(c, events, n, out, offsets=False)
        slots = n.events * n.width
        if slots:
            _padded_kernel[(triton.cdiv(slots, ITEM_BLOCK),)](
                scratch, n.events, n.width, c.dom_sensor_id, c.sensor_position,
                c.dom_pulse_offsets, c.pulse_time, c.pulse_charge,
                c.pulse_auxiliary.view(_uint8()), out["dom_features"], out["dom_mask"],
                PULSES=pulses_per_dom, BLOCK=ITEM_BLOCK,
            )

    return gather


def _uint8() -> "torch.dtype":
    import torch

    return torch.uint8
