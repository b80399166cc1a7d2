"""Output buffers of resident batches: one device buffer per batch, cut into sections,
reused once nothing handed out views it any more.

A batch's tensors are views of its buffer. The pool keeps each buffer's storage and knows
how many tensors use it (torch counts the tensors sharing a storage): when only the pool's
own references are left, no tensor, slice or view of that batch lives anywhere, and the
buffer is filled again. So a batch kept for many steps (or after the loader is gone) is
never overwritten, and a loop that drops each batch in turn runs on two buffers. On a GPU,
the gather that refills a buffer is queued on the current stream after the work already
queued there, which is what makes reuse safe for work on that stream (torch's own caching
allocator makes the same promise); work on another stream must be ordered by the caller
(``torch.cuda.Stream.wait_stream``), as for any tensor.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Alignment of every section, in bytes (as the streaming loader's).
SECTION_ALIGN = 64


@dataclasses.dataclass(frozen=True)
class SectionSpec:
    """One section of a batch: its handed-out shape, and the shape written (the padded
    layout's rows carry one spare row past the handed-out ones)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    written: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes the section takes in the buffer."""
        return math.prod(self.written) * self.dtype.itemsize


def buffer_bytes(specs: list[SectionSpec]) -> int:
    """Bytes a buffer needs for ``specs``, each section aligned."""
    at = 0
    for spec in specs:
        at = -(-at // SECTION_ALIGN) * SECTION_ALIGN + spec.nbytes
    return at


def carve(buffer: torch.Tensor, specs: list[SectionSpec]
          ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The sections of ``buffer`` (uint8): the tensors handed out, and those the gather
    writes (the same memory)."""
    handed, written = {}, {}
    at = 0
    for spec in specs:
        at = -(-at // SECTION_ALIGN) * SECTION_ALIGN
        whole = buffer[at:at + spec.nbytes].view(spec.dtype).view(spec.written)
        written[spec.name] = whole
        handed[spec.name] = whole if spec.written == spec.shape else (
            whole.view(-1)[:math.prod(spec.shape)].view(spec.shape))
        at += spec.nbytes
    return handed, written


def _use_counter():
    """torch's count of the tensors sharing a storage, or ``None`` where this torch does not
    expose it (then no buffer is ever reused: always safe)."""
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    return lambda storage: count(storage._cdata)


class OutputPool:
    """Batch buffers on one device; see the module documentation for when one is reused."""

    def __init__(self, device: torch.device):
        self.device = device
        self.allocations = 0
        """Buffers allocated so far (constant in the steady state)."""
        self._buffers: list[tuple[torch.Tensor, torch.UntypedStorage, int]] = []
        self._uses = _use_counter()

    def take(self, nbytes: int, capacity: int) -> torch.Tensor:
        """A buffer of at least ``nbytes`` that no handed-out tensor views; a new one of
        ``capacity`` bytes (the largest batch expected) when none is free. Free buffers too
        small for ``nbytes`` are let go."""
        import torch

        uses = self._uses
        if uses is not None:
            for i, (buffer, storage, idle) in enumerate(self._buffers):
                if uses(storage) == idle:
                    if buffer.numel() >= nbytes:
                        return buffer
                    del self._buffers[i]
                    break
        buffer = torch.empty(max(nbytes, capacity), dtype=torch.uint8, device=self.device)
        self.allocations += 1
        if uses is not None:
            storage = buffer.untyped_storage()
            self._buffers.append((buffer, storage, uses(storage)))
        return buffer
