"""The Triton kernels compile once per setting, not again as batch sizes change.

Triton compiles a kernel for each combination of what it specialises its arguments on: an
integer that is a multiple of 16 or is 1, a pointer that is 16-byte aligned. A batch's
sizes and its slice of the epoch's events change from batch to batch, so left to Triton
they would compile each kernel several times in the first epochs, a second or so each
where its cache is cold (seen on an H200: 36.9 ms of adapter a batch over train_dynedge's
first 60 steps, 2.9 ms once cached). These tests record every launch of a batch's kernels
(on the CPU: the launches are recorded, not run) and compute Triton's own specialisation
key for each, as its launcher does. Every batch must give one key per constexpr setting,
where Triton's defaults give several on the same batches.
"""

from __future__ import annotations

from typing import Any

import pytest
import shardify

pytest.importorskip("triton", reason="triton is not installed")


class Launches:
    """Stands for a Triton kernel: ``kernel[grid](*args, **constants)`` is recorded."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **constants: Any) -> None:
            self.calls.append((args, constants))

        return launch

    def keys(self, as_triton_defaults: bool) -> set[Any]:
        """Each launch's specialisation key with the kernel's own settings, or with
        Triton's defaults (every argument specialised)."""
        try:
            from triton._C.libtriton import native_specialize_impl
            from triton.backends.compiler import BaseBackend

            params = [p for p in self.kernel.params if not p.is_constexpr]
        except (ImportError, AttributeError) as missing:
            pytest.skip(f"this Triton's specialisation is not where 3.6-3.9 keep it: {missing}")
        keys = set()
        for args, constants in self.calls:
            assert len(args) == len(params), "every launch passes each argument by position"
            key = tuple(
                native_specialize_impl(BaseBackend, value, param.is_const,
                                       as_triton_defaults or not param.do_not_specialize,
                                       as_triton_defaults
                                       or not param.do_not_specialize_on_alignment)
                for value, param in zip(args, params, strict=True))
            keys.add((key, tuple(sorted(constants.items()))))
        return keys


def compiles(launches: Launches) -> tuple[int, int, int]:
    """(kernels compiled, with Triton's defaults, constexpr settings) for the launches."""
    settings = {constants for _, constants in launches.keys(False)}
    return len(launches.keys(False)), len(launches.keys(True)), len(settings)


def test_the_resident_gather_compiles_each_kernel_once(train_dir, torch, monkeypatch):
    """Every batch of two resident epochs (packed and padded, batches of 1 to 7 events, so
    many sizes are multiples of 16 and some batches start at an odd event) launches each
    gather kernel with one key per constexpr setting."""
    from shardify._resident import fused

    monkeypatch.setenv("SHARDIFY_RESIDENT_GATHER", "fused")
    kernels = {name: Launches(getattr(fused, name))
               for name in ("_events_kernel", "_doms_kernel", "_pulses_kernel",
                            "_padded_kernel")}
    for name, launches in kernels.items():
        monkeypatch.setattr(fused, name, launches)
    batches = 0
    for settings in (dict(layout="packed"), dict(layout="padded", max_doms=40, pulses_per_dom=3)):
        for batch_events in (7, 4, 1):
            loader = shardify.Loader(train_dir, device="cpu", resident=True, seed=3,
                                     batch_events=batch_events, **settings)
            assert loader._batches.gather_kind == "fused"
            batches += sum(1 for _ in loader)
    assert batches > 600
    for name, launches in kernels.items():
        compiled, by_default, settings = compiles(launches)
        assert len(launches.calls) > 100, name
        assert compiled == settings, f"{name}: {compiled} compiles for {settings} settings"
        assert by_default > settings, (
            f"{name}: Triton's defaults give {by_default} keys: the batches did not vary")


def test_the_knn_kernel_compiles_once_per_size_class(torch, monkeypatch):
    """knn_edges' kernel over batches of 100 to 160 nodes in all: one key for each
    (k, padded event size), where Triton's defaults give several."""
    from shardify import _knn_fused
    from shardify.transforms import knn_edges

    monkeypatch.setenv("SHARDIFY_KNN", "fused")
    launches = Launches(_knn_fused._knn_kernel)
    monkeypatch.setattr(_knn_fused, "_knn_kernel", launches)
    generator = torch.Generator().manual_seed(4)
    for nodes in range(100, 161):
        events = torch.tensor([nodes // 3, nodes // 3, nodes - 2 * (nodes // 3)])
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), events.cumsum(0)])
        knn_edges(torch.rand(nodes, 3, generator=generator), offsets, 8)
    assert len(launches.calls) == 61
    compiled, by_default, settings = compiles(launches)
    assert settings == 1, "every event here pads to 64 nodes"
    assert compiled == 1
    assert by_default >= 2, f"Triton's defaults give {by_default} keys"


def test_tritons_before_3_2_take_alignment_under_do_not_specialize(monkeypatch):
    """Triton 3.2 added do_not_specialize_on_alignment; the Tritons of torch 2.1-2.5 have
    only do_not_specialize, which covers a pointer's alignment too: the kernels' jit
    arguments follow the installed Triton's (an unknown one raised TypeError on import)."""
    import triton
    from shardify._kernels import compiled_for_any

    def jit_of_triton_3_9(fn=None, *, version=None, repr=None, launch_metadata=None,
                          do_not_specialize=None, do_not_specialize_on_alignment=None,
                          debug=None, noinline=None):
        return fn

    def jit_of_triton_3_1(fn=None, *, version=None, repr=None, launch_metadata=None,
                          do_not_specialize=None, debug=None, noinline=None):
        return fn

    monkeypatch.setattr(triton, "jit", jit_of_triton_3_9)
    assert compiled_for_any(values=["n_events"], alignments=["events_ptr"]) == {
        "do_not_specialize": ["n_events"], "do_not_specialize_on_alignment": ["events_ptr"]}
    monkeypatch.setattr(triton, "jit", jit_of_triton_3_1)
    assert compiled_for_any(values=["n_events"], alignments=["events_ptr"]) == {
        "do_not_specialize": ["n_events", "events_ptr"]}
    assert compiled_for_any(values=["plane_stride"]) == {"do_not_specialize": ["plane_stride"]}
