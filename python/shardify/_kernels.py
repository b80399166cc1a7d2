"""Which of two paths a GPU function runs: torch operations, or its Triton kernel.

The resident gather (``SHARDIFY_RESIDENT_GATHER``) and the kNN without groups
(``SHARDIFY_KNN``) each have both. An environment variable chooses; unset, the kernel runs
where Triton serves the tensors' device, since there it gives the same bits in one launch
where the torch path takes dozens (timed on an H200, docs/results.md), and torch runs
everywhere else.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
from collections.abc import Sequence
from typing import Any

#: The values the variables take.
PATHS = ("torch", "fused")


def _triton_installed() -> bool:
    """Whether ``triton`` can be imported (a lookup in ``sys.modules`` once it has been)."""
    return importlib.util.find_spec("triton") is not None


def _capability(index: int | None) -> tuple[int, int]:
    """The GPU's compute capability (torch keeps each device's properties once read)."""
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return major, minor


def triton_serves(device: Any) -> bool:
    """Whether Triton compiles for ``device``, a ``torch.device``, by torch's own rule for its
    compiler: a GPU of a ROCm build of torch, or an NVIDIA GPU of compute capability 7.0 or
    more, with the ``triton`` package installed. The CPU never (Triton only interprets
    there, for tests)."""
    if device.type != "cuda" or not _triton_installed():
        return False
    import torch

    return torch.version.hip is not None or _capability(device.index)[0] >= 7


def choose_path(variable: str, device: Any) -> str:
    """``variable`` from the environment when set (``torch`` or ``fused``; anything else is
    a ``ValueError`` naming it), else ``fused`` where :func:`triton_serves` ``device`` and
    ``torch`` elsewhere."""
    chosen = os.environ.get(variable, "")
    if chosen:
        if chosen not in PATHS:
            raise ValueError(f"invalid {variable}: {chosen!r} (expected torch or fused)")
        return chosen
    return "fused" if triton_serves(device) else "torch"


def launching_on(device: Any) -> contextlib.AbstractContextManager[Any]:
    """Where a Triton kernel for tensors on ``device`` is launched from: Triton launches on
    the current CUDA device (and its current stream) whatever its arguments' device, so
    where ``device`` is another GPU this makes it current for the launch (as torch's own
    operations do for themselves); elsewhere it does nothing."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    import torch

    if torch.cuda.current_device() == device.index:
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def compiled_for_any(values: Sequence[str] = (),
                     alignments: Sequence[str] = ()) -> dict[str, list[str]]:
    """``triton.jit``'s arguments that compile a kernel once for any value of the integer
    parameters ``values`` (not again for a multiple of 16, or 1) and any alignment of the
    pointer parameters ``alignments``: a batch's sizes and slices, which change from batch
    to batch. Triton 3.2 and later name alignment apart (``do_not_specialize_on_alignment``);
    before (torch 2.1-2.5), ``do_not_specialize`` covered a pointer's alignment too."""
    import triton

    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        return {"do_not_specialize": list(values),
                "do_not_specialize_on_alignment": list(alignments)}
    return {"do_not_specialize": [*values, *alignments]}
