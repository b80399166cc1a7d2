"""Output buffers of resident batches, reused once nothing handed out views them.

A buffer set holds one flat tensor per section, large enough for any batch of the epoch; a
batch's tensors are prefixes of them (a slice, and a reshape where the section has more
than one dimension: a couple of microseconds of host time per section, where carving
typed views out of one byte buffer cost five times as much). The pool keeps each tensor's
storage and knows how many tensors use it (torch counts the tensors sharing a storage):
when only the pool's own references are left in every section, no tensor, slice or view of
that batch lives anywhere, and the set is filled again. So a batch kept for many steps (or
after the loader is gone) is never overwritten, and a loop that drops each batch in turn
runs on two sets. On a GPU the gather that refills a set is queued on the current stream
after the work already queued there, which is what makes reuse safe for work on that stream
(torch's own caching allocator makes the same promise); work on another stream must be
ordered by the caller (``torch.cuda.Stream.wait_stream``), as for any tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _use_counter() -> Callable[[int], int] | None:
    """torch's count of the tensors sharing a storage, given the storage's handle
    (``UntypedStorage._cdata``), or ``None`` where this torch does not expose it (then no
    buffer is ever reused: always safe)."""
    import torch

    count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)
    return count


class _BufferSet:
    """One flat tensor per section, and what an idle set's use counts are."""

    def __init__(self, tensors: dict[str, torch.Tensor], uses: Callable[[int], int] | None):
        self.tensors = tensors
        # The set keeps its storages, so their handles stay valid (read once: an attribute
        # read per storage and batch was a fifth of taking a set).
        self._storages = [t.untyped_storage() for t in tensors.values()]
        self._handles = [s._cdata for s in self._storages]
        self._uses = uses
        self._idle = [uses(h) for h in self._handles] if uses is not None else None
        self._elements = {name: t.numel() for name, t in tensors.items()}

    def idle(self) -> bool:
        """Whether no tensor but the set's own views any of its storages."""
        uses, idle = self._uses, self._idle
        if uses is None or idle is None:
            return False
        return all(uses(h) == n for h, n in zip(self._handles, idle, strict=True))

    def holds(self, elements: dict[str, int]) -> bool:
        """Whether every section holds ``elements[name]`` elements."""
        held = self._elements
        return all(held[name] >= n for name, n in elements.items())


class OutputPool:
    """Batch buffer sets on one device; see the module documentation for when one is
    reused."""

    def __init__(self, device: torch.device, sections: tuple[tuple[str, torch.dtype], ...]):
        self.device = device
        self.sections = sections
        self.allocations = 0
        """Buffer sets allocated so far (constant in the steady state)."""
        self._sets: list[_BufferSet] = []
        self._uses = _use_counter()
        # Per section, the size every set grows to: twice the largest epoch's capacity seen.
        self._high_water = {name: 0 for name, _ in sections}
        self._capacity: dict[str, int] = {}

    def take(self, elements: dict[str, int], capacity: dict[str, int]) -> dict[str, torch.Tensor]:
        """Flat tensors holding at least ``elements[name]`` elements per section that no
        handed-out tensor views. A new set when none is free: twice the epoch's
        ``capacity[name]`` (the largest batch it plans), and at least what any set was made
        with, so that the later epochs' largest batches (the real data's heavy tail moves an
        epoch's largest batch by half) need none. A free set that cannot hold the epoch's
        capacity is let go."""
        import torch

        if capacity != self._capacity:  # a new plan (once an epoch)
            self._capacity = dict(capacity)
            for name, n in capacity.items():
                self._high_water[name] = max(self._high_water[name], 2 * n)
        for i, candidate in enumerate(self._sets):
            if candidate.idle():
                if candidate.holds(capacity) and candidate.holds(elements):
                    return candidate.tensors
                del self._sets[i]
                break
        # Zeroed: every page is touched now, not one by one as larger batches come (what RSS
        # shows is what the set holds).
        tensors = {name: torch.zeros(max(elements[name], self._high_water[name]) + 1,
                                     dtype=dtype, device=self.device)
                   for name, dtype in self.sections}
        self.allocations += 1
        self._sets.append(_BufferSet(tensors, self._uses))
        return tensors
