"""The whole dataset as one set of concatenated column tensors on one device.

Shards are copied one at a time, straight from their memory maps into slices of tensors
allocated once at their final size: at no moment is there a second full copy of the
dataset, on the host or on the device. The offsets become global (each shard's rebased by
the DOMs and pulses of the shards before it) and are int64 once the dataset holds
``I64_OFFSETS_FROM`` DOMs or pulses, int32 below.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .._dataset import Dataset

#: DOMs or pulses from which the concatenated offsets are int64 (int32 holds fewer).
I64_OFFSETS_FROM = 2**31

#: Bytes of plan per event (its global position, int64) kept on the device for an epoch.
PLAN_BYTES_PER_EVENT = 8

#: The manifest's (safetensors') dtype names, as numpy and torch spell them.
_MANIFEST_DTYPES = {"BOOL": "bool", "U8": "uint8", "I16": "int16", "I32": "int32",
                    "I64": "int64", "F32": "float32", "F64": "float64"}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a numpy dtype name (the native module's spelling) or of a
    manifest dtype name."""
    import torch

    dtype: torch.dtype = getattr(torch, _MANIFEST_DTYPES.get(name, name))
    return dtype


@dataclasses.dataclass
class Columns:
    """Every column of a dataset, concatenated in manifest order (the order of the global
    positions the epoch plan uses), on one device."""

    event_id: torch.Tensor
    """``[E]`` int64."""
    event_azimuth: torch.Tensor | None
    """``[E]`` float64, when the dataset has labels."""
    event_zenith: torch.Tensor | None
    """``[E]`` float64, when the dataset has labels."""
    event_dom_offsets: torch.Tensor
    """``[E + 1]`` int32 or int64: the DOMs of event ``e`` are ``[o[e], o[e + 1])``."""
    dom_sensor_id: torch.Tensor
    """``[D]`` in the stored dtype."""
    dom_pulse_offsets: torch.Tensor
    """``[D + 1]`` int32 or int64: the pulses of DOM ``d`` are ``[o[d], o[d + 1])``."""
    pulse_time: torch.Tensor
    """``[P]`` in the stored dtype."""
    pulse_charge: torch.Tensor
    """``[P]`` in the stored dtype."""
    pulse_auxiliary: torch.Tensor
    """``[P]`` bool."""
    sensor_position: torch.Tensor
    """``[S, 3]``: the sensor table, row = sensor id, in its stored dtype."""

    @property
    def labels(self) -> bool:
        """Whether the events carry azimuth and zenith."""
        return self.event_azimuth is not None

    @property
    def nbytes(self) -> int:
        """Bytes the columns hold."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    def to(self, device: Any) -> Columns:
        """The same columns on ``device`` (``"meta"`` for shapes without data)."""
        return dataclasses.replace(
            self, **{name: t.to(device) for name, t in self._tensors().items()}
        )


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What a resident dataset takes on its device, in bytes."""

    columns: int
    """The concatenated columns and the sensor table."""
    plan: int
    """An epoch's plan (one int64 per event)."""
    offsets_dtype: str
    """``"int32"`` or ``"int64"``."""

    @property
    def total(self) -> int:
        """Everything, before the (few) batch buffers."""
        return self.columns + self.plan


def footprint(dataset: Dataset, i64_from: int | None = None) -> Footprint:
    """The bytes ``dataset`` (or a split) takes resident, from its counts and the manifest's
    dtypes alone (nothing is read); offsets are int64 from ``i64_from`` DOMs or pulses
    (default :data:`I64_OFFSETS_FROM`)."""
    types = dataset.manifest["schema"]["types"]
    events, doms, pulses = dataset.events, dataset.doms, dataset.pulses
    limit = I64_OFFSETS_FROM if i64_from is None else i64_from
    wide = doms >= limit or pulses >= limit
    offset = 8 if wide else 4

    def size(name: str) -> int:
        return torch_dtype(name).itemsize

    per_event = 8 + (16 if types["labels"] else 0) + offset
    per_dom = size(types["sensor_id"]) + offset
    per_pulse = size(types["time"]) + size(types["charge"]) + 1
    table = dataset.geometry.nbytes
    columns = events * per_event + doms * per_dom + pulses * per_pulse + 2 * offset + table
    return Footprint(
        columns=columns,
        plan=events * PLAN_BYTES_PER_EVENT,
        offsets_dtype="int64" if wide else "int32",
    )


def free_bytes(device: torch.device) -> int | None:
    """Memory free on ``device``: ``torch.cuda.mem_get_info`` on a GPU, the kernel's
    ``MemAvailable`` on the host; ``None`` where it cannot be known (the meta device)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size
    return None


class DoesNotFit(MemoryError):
    """The dataset does not fit in the device's free memory (raised before allocating)."""


def check_fits(dataset: Dataset, device: torch.device, need: Footprint, free: int | None) -> None:
    """Raises :class:`DoesNotFit`, naming the bytes needed and free, when ``need`` exceeds
    ``free``."""
    if free is not None and need.total > free:
        raise DoesNotFit(
            f"the dataset {dataset.path} needs {_size(need.total)} ({need.total} bytes: "
            f"{need.columns} of columns and {need.plan} of epoch plan) on {device}, but "
            f"{_size(free)} ({free} bytes) are free there: use a subset of the shards, a "
            f"larger device, or the streaming loader (resident=False)"
        )


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


class _Progress:
    """A one-line progress report of the events loaded, on a terminal (nothing otherwise)."""

    def __init__(self, enabled: bool | None, events: int, device: torch.device):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total, self.device, self.started = events, device, time.perf_counter()

    def update(self, shard: int, shards: int, done: int) -> None:
        if self.enabled:
            rate = done / max(time.perf_counter() - self.started, 1e-9)
            print(
                f"\rshardify: loading shard {shard}/{shards} into {self.device}: "
                f"{done:,} of {self.total:,} events ({rate / 1e6:.2f}M events/s)",
                end="", file=sys.stderr, flush=True,
            )

    def finish(self) -> None:
        if self.enabled:
            print(file=sys.stderr, flush=True)


def load_columns(
    dataset: Dataset,
    device: torch.device,
    *,
    i64_from: int | None = None,
    progress: bool | None = None,
) -> Columns:
    """Copies every shard of ``dataset`` (or the events of a split) into concatenated columns
    on ``device``, one shard at a time, after checking that they fit (:class:`DoesNotFit`
    otherwise, before any allocation). Offsets are int64 from ``i64_from`` DOMs or pulses
    (default :data:`I64_OFFSETS_FROM`). ``progress``: a line on stderr (default: when
    stderr is a terminal). Shards are validated (and checksummed, per the dataset's policy)
    as they are read."""
    import torch

    need = footprint(dataset, i64_from)
    check_fits(dataset, device, need, free_bytes(device))
    types = dataset.manifest["schema"]["types"]
    events, doms, pulses = dataset.events, dataset.doms, dataset.pulses
    offsets = getattr(torch, need.offsets_dtype)

    def empty(n: int, name: str) -> torch.Tensor:
        return torch.empty(n, dtype=torch_dtype(name), device=device)

    columns = Columns(
        event_id=torch.empty(events, dtype=torch.int64, device=device),
        event_azimuth=empty(events, "F64") if types["labels"] else None,
        event_zenith=empty(events, "F64") if types["labels"] else None,
        event_dom_offsets=torch.empty(events + 1, dtype=offsets, device=device),
        dom_sensor_id=empty(doms, types["sensor_id"]),
        dom_pulse_offsets=torch.empty(doms + 1, dtype=offsets, device=device),
        pulse_time=empty(pulses, types["time"]),
        pulse_charge=empty(pulses, types["charge"]),
        pulse_auxiliary=torch.empty(pulses, dtype=torch.bool, device=device),
        sensor_position=torch.from_numpy(dataset.geometry.copy()).to(device),
    )
    level_of = {"event": 0, "dom": 1, "pulse": 2}
    at = [0, 0, 0]  # events, DOMs, pulses of the shards copied so far
    shards = dataset._native.shard_counts()
    report = _Progress(progress, events, device)
    for i, counts in enumerate(shards):
        stored = {name: torch.utils.dlpack.from_dlpack(array)
                  for name, array in dataset._native.shard_tensors(i)}
        for name, source in stored.items():
            target = getattr(columns, name, None)
            if target is None or name in ("event_dom_offsets", "dom_pulse_offsets"):
                continue  # lineage stays on disk; offsets are rebased below
            start = at[level_of[name.split("_", 1)[0]]]
            target[start:start + source.shape[0]].copy_(source)
        for name, level, base in (("event_dom_offsets", 0, at[1]),
                                  ("dom_pulse_offsets", 1, at[2])):
            source, target = stored[name], getattr(columns, name)
            # n + 1 entries: the last is the next shard's first, written again by it.
            piece = target[at[level]:at[level] + source.shape[0]]
            piece.copy_(source)
            piece.add_(base)
        at = [at[0] + counts[0], at[1] + counts[1], at[2] + counts[2]]
        report.update(i + 1, len(shards), at[0])
    report.finish()
    return columns
