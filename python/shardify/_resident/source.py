"""The batches of a resident loader: the Rust sampler's epoch plan, gathered on the device.

Once per epoch (or after a seek) the library plans this rank's batches
(``_native.Loader.epoch_plan``: the streaming loader's very order) and the plan's event
positions are uploaded to the device in one copy (asynchronous, from pinned memory, on a
GPU); the next epoch's plan is made on a thread meanwhile, so that an epoch's end does not
wait for it. Each batch is then a slice of that tensor and a fixed sequence of device
operations whose every size comes from the plan on the host: nothing per batch waits for the
device.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import _native
from .._kernels import choose_path, launching_on
from .buffers import OutputPool
from .columns import Columns, load_columns, torch_dtype
from .gather import BatchSizes, gather_packed, gather_padded

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch

    from .._dataset import Dataset

    # The plan's int64 columns, as np.from_dlpack types them (any number).
    PlanColumn = npt.NDArray[Any]

#: Environment variable choosing the gather: ``torch`` (torch operations, the reference)
#: or ``fused`` (Triton kernels; on CPU tensors only under ``TRITON_INTERPRET=1``).
GATHER_VARIABLE = "SHARDIFY_RESIDENT_GATHER"

Gather = Callable[[Columns, "torch.Tensor", BatchSizes, dict[str, "torch.Tensor"]], None]


@dataclasses.dataclass(frozen=True)
class Layout:
    """The batch layout, packed (``pulses_per_dom`` is None) or padded, and the shape of
    each of its sections in a batch of given sizes."""

    sections: tuple[tuple[str, torch.dtype], ...]
    """Section names and dtypes, in the streaming loader's order."""
    max_doms: int | None = None
    pulses_per_dom: int | None = None

    @property
    def padded(self) -> bool:
        return self.pulses_per_dom is not None

    @property
    def features(self) -> int:
        """Features per DOM slot (padded layout): x, y, z, pulse count, 3 per pulse."""
        return 4 + 3 * (self.pulses_per_dom or 0)

    def elements(self, n: BatchSizes) -> dict[str, int]:
        """Elements each section's gather writes in a batch of sizes ``n`` (the padded
        layout's rows, one spare row included)."""
        slots = n.events * n.width + 1
        per = {"event_dom_offsets": n.events + 1, "dom_pulse_offsets": n.doms + 1,
               "dom_position": 3 * n.doms, "dom_features": slots * self.features,
               "dom_mask": slots}
        level = {"event": n.events, "dom": n.doms, "pulse": n.pulses}
        return {name: per[name] if name in per else level[name.split("_", 1)[0]]
                for name, _ in self.sections}

    def views(self, flat: dict[str, torch.Tensor], n: BatchSizes, elements: dict[str, int]
              ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """A batch's sections as prefixes of the flat tensors ``flat`` (``elements`` is
        :meth:`elements` of ``n``): those handed out, and those the gather writes (the same
        memory)."""
        handed, written = {}, {}
        for name, _ in self.sections:
            whole = flat[name][:elements[name]]
            if name == "dom_position":
                whole = handed[name] = whole.view(n.doms, 3)
            elif name == "dom_features":
                slots = n.events * n.width
                handed[name] = whole[:slots * self.features].view(n.events, n.width,
                                                                   self.features)
                whole = whole.view(slots + 1, self.features)
            elif name == "dom_mask":
                handed[name] = whole[:n.events * n.width].view(n.events, n.width)
            else:
                handed[name] = whole
            written[name] = whole
        return handed, written


@dataclasses.dataclass
class EpochPlan:
    """One epoch's plan for this rank from batch ``first`` on, its events on the device."""

    epoch: int
    origin: int
    """The global batch the ranks deal from (0 but after an elastic resume)."""
    first: int
    """Batches this rank took (since ``origin``) before the plan's first."""
    events: torch.Tensor
    """``[N]`` int64 global positions, in delivery order, on the device."""
    starts: list[int]
    doms: list[int]
    pulses: list[int]
    max_doms: list[int]
    capacity: dict[str, int]
    """Elements per section of a buffer set that holds any batch of the plan."""

    @property
    def batches(self) -> int:
        return len(self.doms)

    def sizes(self, b: int, layout: Layout) -> BatchSizes:
        """Batch ``b``'s sizes (``b`` counted from ``first``)."""
        width = min(self.max_doms[b], layout.max_doms or 0) if layout.padded else 0
        return BatchSizes(self.starts[b + 1] - self.starts[b], self.doms[b], self.pulses[b],
                          width)


def gather_batch(gather: Gather, layout: Layout, pool: OutputPool, columns: Columns,
                 events: torch.Tensor, plan: EpochPlan, b: int) -> dict[str, torch.Tensor]:
    """Batch ``b`` of ``plan`` (counted from its first), gathered from ``columns`` into a
    buffer of ``pool``; ``events`` is the plan's events tensor (on the columns' device)."""
    n = plan.sizes(b, layout)
    elements = layout.elements(n)
    handed, written = layout.views(pool.take(elements, plan.capacity), n, elements)
    gather(columns, events[plan.starts[b]:plan.starts[b + 1]], n, written)
    return handed


def _gather_for(kind: str, layout: Layout) -> Gather:
    """The gather function: ``"torch"`` or ``"fused"`` for ``layout``."""
    if kind == "fused":
        from . import fused

        if layout.pulses_per_dom is not None:
            return fused.gather_padded(layout.pulses_per_dom)
        return fused.gather_packed
    if layout.padded:
        k = layout.pulses_per_dom

        def padded(c: Columns, events: torch.Tensor, n: BatchSizes,
                   out: dict[str, torch.Tensor]) -> None:
            gather_padded(c, events, n, k, out)  # type: ignore[arg-type]

        return padded
    return gather_packed


def choose_gather(device: torch.device) -> str:
    """``SHARDIFY_RESIDENT_GATHER`` when set, else ``fused`` where Triton serves ``device``
    and ``torch`` otherwise (:func:`shardify._kernels.choose_path`)."""
    return choose_path(GATHER_VARIABLE, device)


class ResidentBatches:
    """Batches of a dataset held whole on ``device``; positions and epochs as the
    streaming loader's."""

    def __init__(self, native: Any, dataset: Dataset, device: torch.device, layout: Layout,
                 *, progress: bool | None = None, gather: str | None = None):
        self._native = native
        self.device = device
        self.layout = layout
        self.gather_kind = gather or choose_gather(device)
        self._gather = _gather_for(self.gather_kind, layout)
        # Loaded at the first batch, not here: a loader made before DDP's processes chose
        # their GPUs (Lightning's, which sets them inside fit) is rebuilt for its own GPU
        # when first used, and would otherwise have put a copy on the device current
        # then (GPU 0 in every rank) first.
        self._dataset, self._progress = dataset, progress
        self._columns: Columns | None = None
        self.pool = OutputPool(device, layout.sections)
        self._position = (0, 0, 0)
        self._plan: EpochPlan | None = None
        # The next epoch's plan, made on a thread while this epoch's batches are gathered
        # (planning a complete shuffle of 30M events takes seconds).
        self._next_plan: tuple[int, concurrent.futures.Future[Any]] | None = None
        # Held by the thread inside next() or seek(): a second thread is refused, as the
        # streaming loader refuses it, where it would race for the position and the plan
        # (each thread's epoch would overlap the others', events handed out twice).
        self._in_use = threading.Lock()

    @property
    def columns(self) -> Columns:
        """The dataset's columns on the device, read (and checked) at the first use."""
        if self._columns is None:
            self._columns = load_columns(self._dataset, self.device, progress=self._progress)
        return self._columns

    def position(self) -> tuple[int, int, int]:
        """(epoch, origin, batches handed out since origin)."""
        return self._position

    def seek(self, epoch: int, origin: int, batches_taken: int) -> None:
        """Moves to batch ``batches_taken`` of ``epoch`` dealt from global batch ``origin``."""
        with self._one_thread():
            self._position = (epoch, origin, batches_taken)

    @contextlib.contextmanager
    def _one_thread(self) -> Iterator[None]:
        """Held while the position moves; a ``RuntimeError`` when another thread holds it."""
        if not self._in_use.acquire(blocking=False):
            raise RuntimeError(_native.ONE_THREAD_AT_A_TIME)
        try:
            yield
        finally:
            self._in_use.release()

    def next(self) -> dict[str, torch.Tensor] | None:
        """The next batch of the epoch, or ``None`` (and the next epoch's start) at its end."""
        with self._one_thread():
            return self._next()

    def _next(self) -> dict[str, torch.Tensor] | None:
        epoch, origin, taken = self._position
        plan = self._plan_at(epoch, origin, taken)
        b = taken - plan.first
        if b >= plan.batches:
            self._position = (epoch + 1, 0, 0)
            return None
        with launching_on(self.device):
            batch = gather_batch(self._gather, self.layout, self.pool, self.columns,
                                 plan.events, plan, b)
        self._position = (epoch, origin, taken + 1)
        return batch

    def _plan_at(self, epoch: int, origin: int, taken: int) -> EpochPlan:
        """The plan holding batch ``taken`` (since ``origin``) of ``epoch``: the current one,
        or a new one."""
        plan = self._plan
        if plan is None or (plan.epoch, plan.origin) != (epoch, origin) or not (
                plan.first <= taken <= plan.first + plan.batches):
            self._plan = None  # its device tensor goes before the next one comes
            plan = self._plan = self._load_plan(epoch, origin, taken)
            self._next_plan = (epoch + 1, _planner().submit(self._native.epoch_plan,
                                                            epoch + 1, 0, 0))
        return plan

    def _load_plan(self, epoch: int, origin: int, taken: int) -> EpochPlan:
        import numpy as np
        import torch

        ahead, self._next_plan = self._next_plan, None
        if ahead is not None and ahead[0] == epoch and (origin, taken) == (0, 0):
            arrays = ahead[1].result()
        else:
            arrays = self._native.epoch_plan(epoch, origin, taken)
        on_host = torch.utils.dlpack.from_dlpack(arrays[0])
        if self.device.type == "cuda":
            on_device = on_host.pin_memory().to(self.device, non_blocking=True)
        else:
            on_device = on_host.to(self.device)
        starts, doms, pulses, max_doms = (np.from_dlpack(a) for a in arrays[1:])
        return EpochPlan(
            epoch=epoch, origin=origin, first=taken, events=on_device, starts=starts.tolist(),
            doms=doms.tolist(), pulses=pulses.tolist(), max_doms=max_doms.tolist(),
            capacity=self._capacity(np.diff(starts), doms, pulses, max_doms),
        )

    def _capacity(self, events: PlanColumn, doms: PlanColumn, pulses: PlanColumn,
                  max_doms: PlanColumn) -> dict[str, int]:
        """Elements per section of a buffer set that holds any batch of the plan: those of a
        batch as large as the largest in every size (each section grows with the sizes)."""
        if doms.size == 0:
            return self.layout.elements(BatchSizes(0, 0, 0, 0))
        widest = min(int(max_doms.max()), self.layout.max_doms or 0)
        largest = BatchSizes(int(events.max()), int(doms.max()), int(pulses.max()),
                             widest if self.layout.padded else 0)
        return self.layout.elements(largest)


_PLANNER: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None


def _planner() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that plans next epochs, shared by the process's resident loaders.

    One thread for all: a thread per loader would leave, loader after loader, the memory its
    plans were made in fragmented in a malloc arena of its own (measured: +2.5 MiB of RSS
    over 60 resident loaders of 320k events, flat with a shared thread). Made again in a
    forked child, where the parent's thread does not exist."""
    global _PLANNER
    if _PLANNER is None or _PLANNER[0] != os.getpid():
        _PLANNER = (os.getpid(), concurrent.futures.ThreadPoolExecutor(1, "shardify-plan"))
    return _PLANNER[1]


def settle_planner() -> None:
    """Waits until every next-epoch plan already asked for is made. A plan outlives a
    loader dropped while it runs (it is not interrupted; it ends by itself), and while it
    runs its sampler thread counts among the process's threads: what measures threads (the
    leak check) settles the planner first."""
    if _PLANNER is not None and _PLANNER[0] == os.getpid():
        # One thread, first in first out: a no-op done means every earlier plan is done.
        _PLANNER[1].submit(lambda: None).result()


def layout_of(native: Any, max_doms: int | None, pulses_per_dom: int | None) -> Layout:
    """The layout the native loader was configured with, its sections and dtypes."""
    sections = tuple((name, torch_dtype(dtype)) for name, dtype in native.sections())
    return Layout(sections, max_doms, pulses_per_dom)
