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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _use_counter() -> Callable[[torch.UntypedStorage], int] | None:
    """torch's count of the tensors sharing a storage, or ``None`` where this torch does not
    expose it (then no buffer is ever reused: always safe)."""
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    return lambda storage: count(storage._cdata)


class _BufferSet:
    """One flat tensor per section, and what an idle set's use counts are."""

    def __init__(self, tensors: dict[str, torch.Tensor], uses: Callable[[Any], int] | None):
        self.tensors = tensors
        self._storages = [t.untyped_storage() for t in tensors.values()]
        self._uses = uses
        self._idle = [uses(s) for s in self._storages] if uses is not None else None

    def idle(self) -> bool:
        """Whether no tensor but the set's own views any of its storages."""
        uses, idle = self._uses, self._idle
        if uses is None or idle is None:
            return False
        return all(uses(s) == n for s, n in zip(self._storages, idle, strict=True))

    def holds(self, elements: dict[str, int]) -> bool:
        """Whether every section holds ``elements[name]`` elements."""
        return all(t.numel() >= elements[name] for name, t in self.tensors.items())


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

    def take(self, elements: dict[str, int], capacity: dict[str, int]) -> dict[str, torch.Tensor]:
        """Flat tensors holding at least ``elements[name]`` elements per section that no
        handed-out tensor views. A new set when none is free: twice the epoch's
        ``capacity[name]`` (the largest batch it plans), and at least what any set was made
        with, so that the later epochs' largest batches (the real data's heavy tail moves an
        epoch's largest batch by half) need none. A free set that cannot hold the epoch's
        capacity is let go."""
        import torch

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
