"""Model-ready inputs from a packed batch, computed on the batch's device with torch.

A packed batch groups each event's pulses by DOM (``event_dom_offsets``,
``dom_pulse_offsets``): what DOM-level models want. Pulse-level models (GraphNeT's DynEdge,
the Kaggle competition's transformers) want each event's pulses in time order, often cut to
at most N pulses. :func:`time_ordered` gives that for a whole batch at once, and
:func:`knn_edges` the k-nearest-neighbour graph of every event at once.

Everything is vectorised over the batch: no Python loop over events, no per-event copies.
Host synchronisation (a GPU batch's sizes read back by the host):

* :func:`time_ordered` without ``max_pulses``: none (every size is a tensor's shape);
* with ``max_pulses``: one per batch, how many pulses are kept (boolean selection);
* :func:`pad_pulses`: none with a fixed ``length``; without, one (the longest event);
* :func:`pulse_features`: none;
* :func:`pulse_sequences`: none padded to a fixed length (each kept pulse is scattered
  to its cell of the grid, never counted on the host); one padded to the longest event;
* :func:`knn_edges`: one per batch, the events' node and group counts (the distance blocks,
  or the Triton kernel's tile, are sized from them on the host; the edges are then written
  in place).

>>> from shardify.transforms import time_ordered
>>> for batch in shardify.Loader("dataset/", batch_events=256):   # doctest: +SKIP
...     pulses = time_ordered(batch, max_pulses=256)   # non-auxiliary pulses kept first

A sequence model's input, GraphNeT's features on a padded grid:

>>> from shardify.transforms import pad_pulses, pulse_features
>>> pulses["pulse_features"] = pulse_features(pulses, standardize="graphnet")  # doctest: +SKIP
>>> grid = pad_pulses(pulses, 256)   # grid["pulse_features"]: [B, 256, 6]    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from ._kernels import choose_path, launching_on

_Function = TypeVar("_Function", bound=Callable[..., Any])


def _left_untraced(function: _Function) -> _Function:
    """``function`` as ``torch.compile`` leaves it: called as it is (one graph break), not
    traced. The transforms take their sizes from the data, read on the host, so traced,
    each batch's sizes would compile their pieces again: a DynEdge-shaped model whose
    EdgeConv blocks call :func:`knn_edges`, compiled on the CPU, took 3.1-27.4 s a batch
    over its first 8 batches traced, and 1.6, 0.6, then 0.0 s untraced (docs/python.md).
    Loading torch's compiler for this takes about 0.85 s once, when the module is imported
    (``torch_geometric`` loads it anyway)."""
    try:
        import torch
    except ImportError:  # nothing compiles without torch
        return function
    # Untyped in torch (2.15): called through Any, the function keeps its own type.
    disable: Any = torch.compiler.disable
    return cast(_Function, disable(function))

#: The truncation rules of :func:`time_ordered`, see there.
KEEP_RULES = ("non_auxiliary_first", "random", "charge")

#: The sections :func:`time_ordered` reads.
PACKED_SECTIONS = ("event_id", "event_dom_offsets", "dom_pulse_offsets", "dom_position",
                   "pulse_time", "pulse_charge", "pulse_auxiliary")

#: The sections :func:`pad_pulses` reads: :func:`time_ordered`'s CSR of pulses per event.
TIME_ORDERED_SECTIONS = ("event_pulse_offsets", "pulse_time")

#: The sections :func:`pulse_features` reads: :func:`time_ordered`'s pulses.
PULSE_FEATURE_SECTIONS = ("pulse_position", "pulse_time", "pulse_charge", "pulse_auxiliary")

#: The columns of :func:`pulse_features` (and of ``to_pyg``'s pulse nodes), in order.
PULSE_FEATURES = ("x", "y", "z", "time", "charge", "auxiliary")

#: The scalings :func:`pulse_features` (and ``to_pyg``) take as ``standardize``.
STANDARDIZATIONS = (None, "graphnet")

# Pairs of one block of distances in knn_edges on the CPU (int64 keys: 2 MiB, which stays in
# cache; bigger blocks measured slower on the 2-core CPU) and on a GPU (128 MiB of keys:
# fewer, larger launches; not yet measured on a GPU).
_KNN_BLOCK_ELEMENTS = 1 << 18
_KNN_BLOCK_ELEMENTS_CUDA = 1 << 24

# What one distance block costs beyond its pairs, counted in pairs: its 31-41 torch operations
# (each dispatched from Python, and on a GPU a kernel launch) against one pair's distance,
# key and selection. knn_edges pads events of different sizes into one block when the
# padding costs fewer pairs than another block would. CPU: ~360 us of operations against
# ~20 ns a pair on the Ice Lake 2-core machine (docs/results.md). GPU: measured on an H200
# (`tools/adapters_bench.py --device cuda:0 --block-costs ...`, a 256-event batch cut to 256
# pulses per event): 2^20 to 2^22 within 2% of each other (2 blocks per batch, 3.2 ms),
# 2^19 1.3x, 2^23 and over (one block) 1.07x, one block per size class 4.9x.
_KNN_BLOCK_COST_PAIRS = 1 << 14
_KNN_BLOCK_COST_PAIRS_CUDA = 1 << 21


#: Environment variable choosing how :func:`knn_edges` computes edges without ``groups``:
#: ``torch`` (torch operations in distance blocks, any device) or ``fused`` (one Triton
#: kernel for batches whose events have at most 256 nodes, as ``to_pyg`` cut to 256 pulses
#: gives; larger events take the torch path; on CPU tensors only under
#: ``TRITON_INTERPRET=1``). Unset, ``fused`` where Triton serves the nodes' device (a GPU of
#: compute capability 7.0 or more, Triton installed) and ``torch`` elsewhere.
KNN_VARIABLE = "SHARDIFY_KNN"


def choose_knn(device: Any) -> str:
    """``SHARDIFY_KNN`` when set, else ``fused`` where Triton serves ``device`` and ``torch``
    elsewhere; any other value is a ``ValueError`` (:func:`shardify._kernels.choose_path`)."""
    return choose_path(KNN_VARIABLE, device)


def _knn_block_elements(device: Any) -> int:
    return _KNN_BLOCK_ELEMENTS_CUDA if device.type == "cuda" else _KNN_BLOCK_ELEMENTS


def _knn_block_cost_pairs(device: Any) -> int:
    return _KNN_BLOCK_COST_PAIRS_CUDA if device.type == "cuda" else _KNN_BLOCK_COST_PAIRS

_MASK64 = (1 << 64) - 1


def _require_packed(batch: dict[str, Any], what: str) -> None:
    """A ``ValueError`` naming the sections ``batch`` lacks, or a ``TypeError`` when it is no
    dict of sections or one of them is not a torch tensor (a loader's ``output="numpy"``)."""
    _require_sections(batch, what, PACKED_SECTIONS,
                      "a batch: the dict of sections a shardify.Loader yields",
                      "a packed batch", "(layout=\"packed\", dom_positions=True)")


def _require_time_ordered(pulses: dict[str, Any], what: str,
                          sections: tuple[str, ...]) -> None:
    """As :func:`_require_packed`, for ``what``, which takes :func:`time_ordered`'s pulses
    with ``sections``."""
    _require_sections(pulses, what, sections, "pulses: the dict of sections time_ordered "
                      "returns", "time_ordered's pulses",
                      "(shardify.transforms.time_ordered(batch))")


def _require_sections(batch: dict[str, Any], what: str, sections: tuple[str, ...],
                      taken: str, kind: str, hint: str) -> None:
    """As :func:`_require_packed`, for ``sections``: ``what`` takes ``taken``, a dict
    with ``sections`` (``kind``, made as ``hint`` says)."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"{what} takes {taken}, not {_type_name(batch)}")
    missing = [name for name in sections if name not in batch]
    if missing:
        raise ValueError(f"{what} needs {kind} with {', '.join(missing)} "
                         f"{hint}; it has {', '.join(batch) or 'no sections'}")
    for name in sections:
        _require_tensor(what, name, batch[name])


def _require_tensor(what: str, name: str, section: Any) -> None:
    """A ``TypeError`` naming section ``name`` unless it is a torch tensor."""
    import torch

    if not isinstance(section, torch.Tensor):
        raise TypeError(f"{what} needs torch tensors, and section {name} is "
                        f"{_type_name(section)}: "
                        "make the loader with output=\"torch\" (the default), or wrap "
                        "each array with torch.from_numpy (no copy)")


def _type_name(value: Any) -> str:
    """``value``'s type as a refusal names it: ``numpy.ndarray``, ``builtins.list``."""
    return f"{type(value).__module__}.{type(value).__name__}"


def _check_offsets(offsets: Any, nodes: int) -> None:
    """A ``ValueError`` unless ``offsets`` (a host array) starts at 0, never decreases and
    ends at ``nodes``: CSR offsets of ``nodes`` rows."""
    import numpy as np

    if (offsets.size == 0 or offsets[0] != 0 or offsets[-1] != nodes
            or bool((np.diff(offsets) < 0).any())):
        shown = np.array2string(offsets, threshold=8, edgeitems=3)
        raise ValueError(f"knn_edges: offsets must start at 0, never decrease and end at "
                         f"the node count ({nodes}, the rows of pos); they are {shown}")


def _signed(value: int) -> int:
    """``value`` (taken modulo 2**64) as a signed 64-bit integer, as torch holds it."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


def _mix64(x: Any) -> Any:
    """SplitMix64's finaliser on an int64 tensor (wrapping arithmetic; logical shifts)."""
    import torch

    def shift(v: Any, n: int) -> Any:
        return torch.bitwise_and(v >> n, (1 << (64 - n)) - 1)

    x = x ^ shift(x, 30)
    x = x * _signed(0xBF58476D1CE4E5B9)
    x = x ^ shift(x, 27)
    x = x * _signed(0x94D049BB133111EB)
    return x ^ shift(x, 31)


def random_keys(seed: int, epoch: int, event_id: Any, rank: Any) -> Any:
    """The random sort key of each pulse for ``keep="random"``: a hash of (seed, epoch,
    the pulse's event id, its rank in the event's time order), so an event keeps the same
    pulses in an epoch whatever batch it lands in, and other pulses in another epoch."""
    import torch

    salt = _signed(_mix_int(_mix_int(seed) ^ epoch))
    key = _mix64(event_id.to(torch.int64) ^ salt)
    return _mix64(key + rank.to(torch.int64))


def _mix_int(value: int) -> int:
    """SplitMix64's finaliser on a Python integer (the host half of :func:`random_keys`)."""
    x = value & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _stable_argsort(values: Any) -> Any:
    import torch

    return torch.argsort(values, stable=True)


@_left_untraced
def time_ordered(batch: dict[str, Any], max_pulses: int | None = None,
                 keep: str = "non_auxiliary_first", seed: int = 0,
                 epoch: int = 0) -> dict[str, Any]:
    """Each event's pulses in time order, optionally at most ``max_pulses`` of them.

    ``batch``: a packed batch of torch tensors (``shardify.Loader(..., output="torch")``,
    the default layout). Returns a dict of tensors on the batch's device:

    * ``event_id`` ``[B]`` and, when the batch has labels, ``event_azimuth`` /
      ``event_zenith`` ``[B]``, as in the batch;
    * ``event_pulse_offsets`` ``[B + 1]`` int64: event ``b``'s pulses are rows
      ``offsets[b]:offsets[b + 1]`` of the pulse tensors;
    * ``pulse_time``, ``pulse_charge``, ``pulse_auxiliary`` ``[P]`` (the batch's dtypes);
    * ``pulse_position`` ``[P, 3]``: the pulse's DOM position (the batch's ``dom_position``
      dtype);
    * ``pulse_dom`` ``[P]`` int64: the pulse's DOM, a row of the batch's DOM sections.

    Order: by time, ties by the order the batch stores them (stable), for each event.

    ``max_pulses=N`` keeps at most N pulses per event, chosen by ``keep``, then puts the kept
    ones in time order:

    * ``"non_auxiliary_first"``: the non-auxiliary pulses (``auxiliary == False``) in time
      order, then the auxiliary ones in time order, the first N of that (the rule of the
      Kaggle "IceCube - Neutrinos in Deep Ice" top solutions, which cut long events keeping
      non-auxiliary pulses first);
    * ``"random"``: non-auxiliary first, then auxiliary, each group in a random order, the
      first N (the 2nd place solution sampled 192 pulses per event in training and 512-768
      at inference, the 3rd place 256, picking at random inside each group). The order is a
      hash of (``seed``, ``epoch``, event id, the pulse's rank in time order): reproducible,
      the same for an event whatever batch or rank it lands in, new each epoch;
    * ``"charge"``: the brightest N (largest charge; ties by time order).

    Without ``max_pulses`` no host synchronisation is needed; with it, one (the kept count).
    """
    _require_packed(batch, "time_ordered")
    _require_keep(keep)
    _require_positive_or_none("max_pulses", max_pulses)
    ordered = _TimeOrder.of(batch)
    order, offsets = ordered.order, ordered.event_pulses
    if max_pulses is not None:
        kept, offsets = _kept(batch, ordered, max_pulses, keep, seed, epoch)
        order = order[kept]  # the host reads how many are kept
    kept_dom = ordered.pulse_dom[order]
    out = {
        "event_id": batch["event_id"],
        "event_pulse_offsets": offsets,
        "pulse_time": batch["pulse_time"][order],
        "pulse_charge": batch["pulse_charge"][order],
        "pulse_auxiliary": batch["pulse_auxiliary"][order],
        "pulse_position": batch["dom_position"][kept_dom],
        "pulse_dom": kept_dom,
    }
    return _with_labels(out, batch)


def _with_labels(out: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """``out`` with ``batch``'s labels, when it has them."""
    for label in ("event_azimuth", "event_zenith"):
        if label in batch:
            out[label] = batch[label]
    return out


class _TimeOrder:
    """A packed batch's pulses in time order per event: ``order`` (the pulses sorted by
    event, then time, ties in stored order), each pulse's DOM (``pulse_dom``, a row of the
    DOM sections) and event (``pulse_event``, by stored row; ``event_in_order``, by
    position in ``order``), and the stored CSR of pulses per event (``event_pulses``,
    ``[B + 1]``). No host synchronisation."""

    def __init__(self, order: Any, pulse_dom: Any, pulse_event: Any, event_pulses: Any):
        self.order, self.pulse_dom = order, pulse_dom
        self.pulse_event, self.event_pulses = pulse_event, event_pulses
        self.event_in_order = pulse_event[order]

    @classmethod
    def of(cls, batch: dict[str, Any]) -> _TimeOrder:
        import torch

        time = batch["pulse_time"]
        event_doms = batch["event_dom_offsets"].long()
        dom_pulses = batch["dom_pulse_offsets"].long()
        pulses, doms = time.shape[0], dom_pulses.shape[0] - 1
        # repeat_interleave of the counts alone: each row's index, repeated (no arange).
        pulse_dom = torch.repeat_interleave(dom_pulses.diff(), output_size=pulses)
        dom_event = torch.repeat_interleave(event_doms.diff(), output_size=doms)
        pulse_event = dom_event[pulse_dom]
        # The stored CSR of pulses per event (the DOM groups of an event are contiguous).
        event_pulses = dom_pulses[event_doms]
        return cls(_event_time_order(time, pulse_event), pulse_dom, pulse_event, event_pulses)


@_left_untraced
def pad_pulses(pulses: dict[str, Any], length: int | None = None, *,
               pad_to_multiple_of: int | None = None) -> dict[str, Any]:
    """:func:`time_ordered`'s pulses as a padded ``[B, L]`` grid, one event a row, for
    sequence models (a transformer's ``src_key_padding_mask`` is ``~pulse_mask``).

    ``pulses``: what :func:`time_ordered` returns. Returns a dict of tensors on its device:

    * every ``pulse_*`` section ``[P, ...]`` as ``[B, L, ...]`` (its dtype): event ``b``'s
      pulses in their order at ``[b, :n_b]``, zeros (``False``) after them;
    * ``pulse_mask`` ``[B, L]`` bool: True where a pulse is;
    * ``event_pulses`` ``[B]`` int64: the pulses of each row;
    * the ``event_*`` sections but ``event_pulse_offsets`` (ids, labels), as they are.

    ``length`` (None): ``L``. None takes the batch's longest event (one host
    synchronisation, to read it). A fixed ``L`` needs none and gives every batch one
    shape (``torch.compile``, CUDA graphs); an event longer keeps its first ``L`` pulses,
    so cut events with ``time_ordered(batch, max_pulses=L, keep=...)``, which chooses them.

    ``pad_to_multiple_of`` (None): with ``length=None``, the longest event's length rounded
    up to a multiple of it, as Hugging Face tokenizers' argument of that name: batches of
    similar length (``Loader(..., group_by_length=L)``) then come in a few shapes, which
    ``torch.compile`` and tensor cores like.
    """
    import torch

    _require_time_ordered(pulses, "pad_pulses", TIME_ORDERED_SECTIONS)
    if length is not None and (isinstance(length, bool) or not isinstance(length, int)
                               or length < 0):
        raise ValueError(f"length must be a non-negative integer or None, not {length!r}")
    _require_positive_or_none("pad_to_multiple_of", pad_to_multiple_of)
    if length is not None and pad_to_multiple_of is not None:
        raise ValueError("pad_pulses: pad_to_multiple_of rounds the longest event's length "
                         "up; give it with length=None, or give a length alone")
    offsets = pulses["event_pulse_offsets"].long()
    counts = offsets.diff()
    events, total = counts.shape[0], pulses["pulse_time"].shape[0]
    for name, section in pulses.items():
        if not name.startswith("pulse_"):
            continue
        _require_tensor("pad_pulses", name, section)
        if section.shape[0] != total:
            raise ValueError(f"pad_pulses: section {name} has {section.shape[0]} rows where "
                             f"pulse_time has {total}: not one time_ordered output")
    if length is None:
        length = _rounded_up(_longest(counts), pad_to_multiple_of)
    device = offsets.device
    # Each pulse's cell of the flat [B * L] grid; a pulse past its row's L goes to one spare
    # cell after the grid, which is cut off.
    pulse_event = torch.repeat_interleave(counts, output_size=total)
    slot = torch.arange(total, device=device) - offsets[pulse_event]
    cell = torch.where(slot < length, pulse_event * length + slot, events * length)
    kept = counts.clamp(max=length)
    out = {name: section for name, section in pulses.items()
           if name.startswith("event_") and name != "event_pulse_offsets"}
    for name, section in pulses.items():
        if name.startswith("pulse_"):
            out[name] = _scattered(section, cell, events, length)
    out["pulse_mask"] = torch.arange(length, device=device) < kept[:, None]
    out["event_pulses"] = kept
    return out


def graphnet_time(t: Any) -> Any:
    """GraphNeT IceCubeKaggle's time scaling: (t - 1e4) / 3e4."""
    return (t - 1.0e4) / 3.0e4


def graphnet_charge(q: Any) -> Any:
    """GraphNeT IceCubeKaggle's charge scaling: log10(q) / 3."""
    import torch

    return torch.log10(q) / 3.0


def graphnet_xyz(xyz: Any) -> Any:
    """GraphNeT IceCubeKaggle's position scaling: x / 500."""
    return xyz / 500.0


def require_standardization(standardize: Any) -> None:
    """A ``ValueError`` unless ``standardize`` is one of :data:`STANDARDIZATIONS`."""
    if standardize not in STANDARDIZATIONS:
        raise ValueError(f"invalid standardize: {standardize!r} (expected None or \"graphnet\")")


@_left_untraced
def pulse_features(pulses: dict[str, Any], standardize: str | None = None) -> Any:
    """The node features of :func:`time_ordered`'s pulses, ``[P, 6]`` float32 on their
    device, one row a pulse in their order: x, y, z (the pulse's DOM), time, charge,
    auxiliary (:data:`PULSE_FEATURES`), the columns ``to_pyg``'s pulse nodes have.

    ``standardize``: None (raw units) or ``"graphnet"``: scaled exactly as GraphNeT's
    ``IceCubeKaggle`` detector does (graphnet-team/graphnet,
    ``src/graphnet/models/detector/icecube.py``, ``IceCubeKaggle.feature_map``): x, y, z /
    500; (time - 1e4) / 3e4; log10(charge) / 3; auxiliary as is.

    A sequence model's input: put it in the pulses as a section (``pulses["pulse_features"]
    = pulse_features(pulses)``) and :func:`pad_pulses` pads it to ``[B, L, 6]`` with the
    rest. No host synchronisation: elementwise operations and one concatenation.
    """
    _require_time_ordered(pulses, "pulse_features", PULSE_FEATURE_SECTIONS)
    require_standardization(standardize)
    return _features_and_positions(pulses, standardize)[0]


def _require_keep(keep: Any) -> None:
    """A ``ValueError`` unless ``keep`` is one of :data:`KEEP_RULES`."""
    if keep not in KEEP_RULES:
        raise ValueError(f"invalid keep: {keep!r} (expected one of {', '.join(KEEP_RULES)})")


def _require_positive_or_none(name: str, value: Any) -> None:
    """A ``ValueError`` naming ``name`` unless ``value`` is None or a positive integer."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, not {value!r}")


def _longest(counts: Any) -> int:
    """The largest of ``counts`` (a tensor of pulses per event), read on the host; 0 for
    no event."""
    return int(counts.max()) if counts.numel() else 0


def _rounded_up(length: int, multiple: int | None) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (as it is when None)."""
    return length if multiple is None else -(-length // multiple) * multiple


#: What :func:`pulse_sequences` pads to: ``length`` or the batch's longest event.
PADDINGS = ("length", "longest")


def require_sequence_arguments(length: Any, *, keep: Any = "non_auxiliary_first",
                               standardize: Any = None, padding: Any = "length",
                               pad_to_multiple_of: Any = None, **_: Any) -> None:
    """A ``ValueError`` naming the first of :func:`pulse_sequences`' arguments it refuses
    (any others are ignored): what a loader of sequences checks before its first batch."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive integer, not {length!r}")
    _require_keep(keep)
    require_standardization(standardize)
    if padding not in PADDINGS:
        raise ValueError(f"invalid padding: {padding!r} (expected \"length\" or \"longest\")")
    _require_positive_or_none("pad_to_multiple_of", pad_to_multiple_of)
    if pad_to_multiple_of is not None and padding != "longest":
        raise ValueError("pulse_sequences: pad_to_multiple_of rounds the longest event's "
                         "length up; give it with padding=\"longest\"")


@_left_untraced
def pulse_sequences(batch: dict[str, Any], length: int, *,
                    keep: str = "non_auxiliary_first", standardize: str | None = None,
                    seed: int = 0, epoch: int = 0, padding: str = "length",
                    pad_to_multiple_of: int | None = None) -> dict[str, Any]:
    """A packed batch as a sequence model's input in one call: each event's pulses in time
    order, at most ``length`` of them chosen by ``keep`` (with ``seed`` and ``epoch``, as
    :func:`time_ordered`), their :func:`pulse_features` (scaled as ``standardize`` says) as
    the section ``pulse_features``, all padded (:func:`pad_pulses`) as ``padding`` says:

    * ``"length"``: to ``length``, every batch ``[B, length, ...]`` (one shape);
    * ``"longest"``: to the batch's longest kept event, rounded up to a multiple of
      ``pad_to_multiple_of`` when given (at most ``length``): far less padding for batches
      of similar length (``Loader(..., group_by_length=length)``: with the real statistics
      cut to 256 pulses, 91% of the cells are pulses, against 30% at ``length``).

    With ``pulse_mask``, ``event_pulses``, the ids and labels.

    >>> train = loader.map(lambda batch, epoch: pulse_sequences(   # doctest: +SKIP
    ...     batch, 256, standardize="graphnet", epoch=epoch))

    (:class:`shardify.sequences.SequenceLoader` is that loader, checked against a token
    budget.) The same sections as the three calls, value for value, without their host
    synchronisation: none with ``padding="length"`` (the kept pulses go straight to their
    cells, uncounted; checked on torch's ``meta`` device), one with ``padding="longest"``
    (the longest event).
    """
    import torch

    _require_packed(batch, "pulse_sequences")
    require_sequence_arguments(length, keep=keep, standardize=standardize, padding=padding,
                               pad_to_multiple_of=pad_to_multiple_of)
    ordered = _TimeOrder.of(batch)
    kept, offsets = _kept(batch, ordered, length, keep, seed, epoch)
    counts = offsets.diff()
    if padding == "longest":
        length = min(_rounded_up(_longest(counts), pad_to_multiple_of), length)
    # Every pulse in its stored row, each kept one scattered to its cell of the grid: no
    # compaction of the kept pulses, whose count the host would have to read.
    pulses = {
        "pulse_time": batch["pulse_time"],
        "pulse_charge": batch["pulse_charge"],
        "pulse_auxiliary": batch["pulse_auxiliary"],
        "pulse_position": batch["dom_position"][ordered.pulse_dom],
        "pulse_dom": ordered.pulse_dom,
    }
    pulses["pulse_features"] = _features_and_positions(pulses, standardize)[0]
    cells = _kept_cells(ordered, kept, offsets, length)
    events = counts.shape[0]
    out = _with_labels({"event_id": batch["event_id"]}, batch)
    for name, section in pulses.items():
        out[name] = _scattered(section, cells, events, length, _SPARE_CELLS)
    out["pulse_mask"] = torch.arange(length, device=counts.device) < counts[:, None]
    out["event_pulses"] = counts
    return out


#: The spare cells after a grid that :func:`pulse_sequences` sends the pulses it does not
#: keep to (about half of them with the real statistics cut to 256), each row to the one
#: its position picks, so that a GPU's stores of them do not all go to one address.
_SPARE_CELLS = 1024


def _kept_cells(ordered: _TimeOrder, kept: Any, offsets: Any, length: int) -> Any:
    """Each pulse's cell (by stored row) of a flat ``[B * length]`` grid, from
    :func:`_kept`'s mask (by position in time order) and offsets: a kept pulse's event
    times ``length`` plus its place among the event's kept pulses in time order (below
    ``length``: ``offsets``' counts are at most it); one of the :data:`_SPARE_CELLS` after
    the grid for the others. No host synchronisation."""
    import torch

    event_of = ordered.event_in_order
    place = torch.cumsum(kept, 0) - 1 - offsets[event_of]
    spare = (offsets.shape[0] - 1) * length + torch.arange(
        kept.shape[0], device=kept.device) % _SPARE_CELLS
    in_order = torch.where(kept, event_of * length + place, spare)
    cells = torch.empty_like(in_order)
    cells[ordered.order] = in_order
    return cells


def _scattered(section: Any, cells: Any, events: int, length: int, spare: int = 1) -> Any:
    """``section`` (``[P, ...]``) as a ``[events, length, ...]`` grid of zeros with row ``i``
    at flat cell ``cells[i]``; rows sent to the ``spare`` cells from ``events * length`` on
    are cut off."""
    grid = section.new_zeros((events * length + spare, *section.shape[1:]))
    grid[cells] = section
    return grid[:events * length].view(events, length, *section.shape[1:])


def _features_and_positions(pulses: dict[str, Any], standardize: str | None) -> tuple[Any, Any]:
    """:func:`pulse_features` of ``pulses`` (not checked) and their positions, ``[P, 3]``
    float32 in metres, converted once for both (``to_pyg``'s ``x`` and ``pos``)."""
    import torch

    pos = pulses["pulse_position"].to(torch.float32)
    time = pulses["pulse_time"].to(torch.float32)
    charge = pulses["pulse_charge"].to(torch.float32)
    auxiliary = pulses["pulse_auxiliary"].to(torch.float32)
    if pos.ndim != 2 or pos.shape[1] != 3 or not (
            pos.shape[0] == time.shape[0] == charge.shape[0] == auxiliary.shape[0]):
        raise ValueError(f"pulse_features: pulse_position must be [P, 3] and pulse_time, "
                         f"pulse_charge, pulse_auxiliary [P], not {tuple(pos.shape)}, "
                         f"{tuple(time.shape)}, {tuple(charge.shape)}, "
                         f"{tuple(auxiliary.shape)}")
    xyz = pos
    if standardize == "graphnet":
        xyz, time, charge = graphnet_xyz(pos), graphnet_time(time), graphnet_charge(charge)
    return torch.cat([xyz, time[:, None], charge[:, None], auxiliary[:, None]], dim=1), pos


def _event_time_order(time: Any, pulse_event: Any) -> Any:
    """The pulses sorted by event, then time, ties in stored order."""
    import torch

    if time.dtype in (torch.int8, torch.int16, torch.int32, torch.uint8):
        # One stable sort of (event, time) packed into an int64 (time + 2**31 fits 32 bits).
        key = (pulse_event << 32) | (time.to(torch.int64) + (1 << 31))
        return _stable_argsort(key)
    # Stable sorts: by time, then by event.
    order = _stable_argsort(time)
    return order[_stable_argsort(pulse_event[order])]


def _kept(batch: dict[str, Any], ordered: _TimeOrder, max_pulses: int, keep: str, seed: int,
          epoch: int) -> tuple[Any, Any]:
    """Which pulses (a ``[P]`` bool mask, by position in ``ordered.order``) are the
    ``max_pulses`` that ``keep`` ranks first in each event, and the CSR offsets (``[B + 1]``)
    of what is kept. No host synchronisation."""
    import torch

    order, pulse_event, event_pulses = ordered.order, ordered.pulse_event, ordered.event_pulses
    pulses = order.shape[0]
    device = order.device
    # `order` is sorted by event, and so is `priority` below: at every position both hold a
    # pulse of the same event, so `rank` (a position's rank in its event) serves both: in
    # `order` a pulse's rank in time order, in `priority` its rank in `keep`'s preference.
    event_of = ordered.event_in_order
    rank = torch.arange(pulses, device=device) - event_pulses[event_of]
    # `priority`: the event's pulses best first, built by stable sorts from the least
    # significant key to the most (the event).
    if keep == "charge":
        charge = batch["pulse_charge"][order]
        priority = order[_stable_argsort(-charge)]
        priority = priority[_stable_argsort(pulse_event[priority])]
    else:
        priority, priority_event = order, event_of
        if keep == "random":
            event_id = batch["event_id"][event_of]
            priority = order[_stable_argsort(random_keys(seed, epoch, event_id, rank))]
            priority_event = pulse_event[priority]
        # One stable sort by (event, auxiliary): non-auxiliary first within each event.
        auxiliary = batch["pulse_auxiliary"][priority].to(torch.int64)
        priority = priority[_stable_argsort((priority_event << 1) | auxiliary)]
    kept = torch.zeros(pulses, dtype=torch.bool, device=device)
    kept[priority] = rank < max_pulses
    counts = event_pulses.diff().clamp(max=max_pulses)
    offsets = torch.zeros_like(event_pulses)
    torch.cumsum(counts, 0, out=offsets[1:])
    return kept[order], offsets


@_left_untraced
def knn_edges(pos: Any, offsets: Any, k: int, *, groups: Any = None,
              group_count: int | None = None) -> Any:
    """The k-nearest-neighbour edges of every event of a batch at once.

    ``pos`` ``[N, 3]``: node positions; ``offsets`` ``[B + 1]``: event ``b``'s nodes are rows
    ``offsets[b]:offsets[b + 1]`` (from 0, never decreasing, to N, else ``ValueError``; on a
    GPU torch's own device-side check may stop bad offsets first). Returns ``edge_index``
    ``[2, E]`` int64 on ``pos``'s device, PyG's ``knn_graph`` convention
    (``flow="source_to_target"``, no self loops): row 0 the neighbour, row 1 the node whose
    neighbour it is, sorted by that node, then nearest first. A node of an event of n nodes
    gets min(k, n - 1) neighbours, all in its event.

    Distances are squared Euclidean in float32, ``(dx*dx + dy*dy) + dz*dz``; ties (pulses
    of one DOM share its position) go to the lower row, so the result is deterministic.

    ``groups`` (optional, int ``[N]``, ids below ``group_count``, which defaults to
    ``groups.max() + 1``): nodes that share a position share an id, e.g. a pulse's DOM
    (``pulse_dom``, as ``to_pyg`` passes it). The edges are the same; the distances are
    computed once per group instead of once per node (pulses of one DOM need the same
    neighbours but themselves). Each id's nodes must lie in one event, at one position, and
    the ids must ascend event by event (a batch's DOM rows do); otherwise ``ValueError``.

    Events are grouped by size (a few sizes per octave) and their distances computed in
    blocks of at most 2**18 pairs on the CPU (small enough to stay in its caches; 2**24 on a
    GPU, for fewer launches), so an event of thousands of nodes costs its (groups x nodes)
    pairs in bounded memory (``torch_cluster`` has no wheel for this torch; this is plain
    torch; at its peak a block holds some 24 bytes per pair on a GPU, 16 on the CPU). Each
    block is 31 torch operations on a GPU (41 with ``groups``; each a kernel launch), 35 /
    45 on the CPU (its distances axis by axis, for its caches), so events
    of neighbouring sizes share a block, padded to the largest, wherever the padding costs
    less than another block: on a GPU a 256-event batch cut to 256 pulses per event takes 2
    blocks instead of 18. Each block writes its edges in place, in node order, so nothing is
    sorted or selected afterwards: one host synchronisation reads the node and group counts
    (two with ``groups`` and no ``group_count``), and no other.

    On a GPU that Triton serves (unless ``SHARDIFY_KNN=torch``, :data:`KNN_VARIABLE`), with
    no ``groups`` and no event over 256 nodes (``to_pyg`` on a GPU with ``max_pulses`` at
    most 256), one Triton kernel computes every event's edges instead of the blocks: the
    same edges, with 15 torch operations and one launch where the blocks of a 256-event
    batch cut to 256 pulses take 77 operations (on an H200: 0.97 ms against 2.12 ms a
    batch; ``tools/adapters_bench.py --device cuda:0`` times both).
    """
    import numpy as np
    import torch

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, not {k!r}")
    for name, value in (("pos", pos), ("offsets", offsets)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"knn_edges: {name} must be a torch tensor, not "
                            f"{_type_name(value)}")
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ValueError(f"knn_edges: pos must be [N, 3] (x, y, z per node), not shape "
                         f"{tuple(pos.shape)}")
    if offsets.ndim != 1:
        raise ValueError(f"knn_edges: offsets must be [B + 1], not shape {tuple(offsets.shape)}")
    device = pos.device
    pos = pos.to(torch.float32)
    offsets = offsets.long()
    nodes, events = pos.shape[0], offsets.shape[0] - 1
    # Checked once: on the CPU here, where it is free; on a GPU with the counts read back
    # below (bad ones may have tripped a device-side assertion of torch's first).
    on_host = offsets.device.type == "cpu"
    if on_host:
        _check_offsets(offsets.numpy(), nodes)
    node_event = torch.repeat_interleave(offsets.diff(), output_size=nodes)
    slot, group_pos, group_offsets, consistent = _position_groups(
        pos, offsets, node_event, groups, group_count)
    host = torch.cat([offsets, group_offsets, consistent.long()[None]]).cpu().numpy()
    starts_host, group_starts_host = host[:events + 1], host[events + 1:-1]
    if not on_host:
        _check_offsets(starts_host, nodes)
    if not host[-1]:
        raise ValueError("knn_edges: groups must give each id's nodes one event and one "
                         "position, with ids ascending event by event")
    counts_host, group_counts_host = np.diff(starts_host), np.diff(group_starts_host)
    # Node i's edges are rows edge_before[i] + 1 to edge_before[i] + min(k, n - 1) of the
    # result, n its event's node count: each block scatters its edges there, in node order.
    event_counts = offsets.diff()
    per_node = (event_counts[node_event] - 1).clamp_(min=0, max=k)
    edge_before = torch.cumsum(per_node, 0) - (per_node + 1)
    edge_count = int((counts_host * np.clip(counts_host - 1, 0, k)).sum())
    # One column more than the edges: where the blocks put the candidates they drop.
    edge_index = torch.empty(2, edge_count + 1, dtype=torch.int64, device=device)
    # Coordinates as three planes ([3, N]): a block's differences are then one operation.
    planes = pos.t().contiguous()
    if slot is None and choose_knn(device) == "fused":
        from ._knn_fused import MAX_NODES, knn_edges_fused

        largest = int(counts_host.max(initial=0))
        if largest <= MAX_NODES:
            with launching_on(device):
                knn_edges_fused(planes, offsets[:-1], event_counts, largest, k, edge_before,
                                edge_index)
            return edge_index[:, :edge_count]
    # Events of more than one node, largest padded size first (a quarter of an octave at
    # most is padding): their node and group ranges in that order, in one upload, then
    # every block is a slice of it. (The host's arrays are numpy's: on a GPU a torch
    # operation on a CPU tensor costs a dispatch, a numpy one a fraction of it.)
    padded = np.array([_padded_size(n) for n in counts_host.tolist()], dtype=np.int64)
    order_host = np.argsort(-padded, kind="stable")
    order_host = order_host[counts_host[order_host] > 1]
    ranges = np.stack([starts_host[:-1], counts_host, group_starts_host[:-1],
                       group_counts_host])[:, order_host]
    starts, counts, group_starts, group_counts = torch.from_numpy(ranges).to(device)
    sizes_host = padded[order_host].tolist()
    widths_host = group_counts_host[order_host].tolist()
    group_planes = planes if slot is None else group_pos.t().contiguous()
    for first, end in _plan_blocks(sizes_host, widths_host, _knn_block_elements(device),
                                   _knn_block_cost_pairs(device)):
        block = _EventBlock(starts[first:end], counts[first:end], group_starts[first:end],
                            group_counts[first:end], sizes_host[first],
                            max(widths_host[first:end]))
        _knn_block(planes, slot, group_planes, block, k, edge_before, edge_index)
    return edge_index[:, :edge_count]


def _plan_blocks(sizes: list[int], widths: list[int], budget: int,
                 block_cost: int) -> list[tuple[int, int]]:
    """The blocks ``[first, end)`` of events (``sizes``: padded node counts, largest first;
    ``widths``: group counts): the groups of :func:`_group_classes`, each cut into blocks of
    at most ``budget // size**2`` events (one block's memory), ``size`` its largest."""
    blocks = []
    for first, end in _group_classes(sizes, widths, budget, block_cost):
        per_block = _events_per_block(budget, sizes[first])
        blocks += [(b, min(b + per_block, end)) for b in range(first, end, per_block)]
    return blocks


def _events_per_block(budget: int, size: int) -> int:
    """Events of ``size`` nodes (padded) whose ``size**2`` pairs each fit ``budget``: 1 at
    least."""
    return max(1, budget // (size * size))


def _group_classes(sizes: list[int], widths: list[int], budget: int,
                   block_cost: int) -> list[tuple[int, int]]:
    """Events ``[first, end)`` whose distances are computed padded to one size.

    Events of one padded size form a class; a group is a run of consecutive classes, padded
    to its first (largest) size and its widest event. A group of E events costs
    ``ceil(E / per_block) * block_cost + E * size * widest`` pairs (``per_block`` the events
    ``budget`` allows at that size); the groups returned minimise the sum (exactly, over
    every partition of the classes into runs)."""
    classes: list[tuple[int, int, int]] = []  # (first event, events, widest)
    for i, (size, width) in enumerate(zip(sizes, widths, strict=True)):
        if classes and sizes[classes[-1][0]] == size:
            first, events, widest = classes[-1]
            classes[-1] = (first, events + 1, max(widest, width))
        else:
            classes.append((i, 1, width))
    # best[c]: the least cost of classes c onwards; cut[c]: where the group starting at c ends.
    best = [0] * (len(classes) + 1)
    cut = [len(classes)] * len(classes)
    for c in range(len(classes) - 1, -1, -1):
        size = sizes[classes[c][0]]
        per_block = _events_per_block(budget, size)
        best[c], events, widest = -1, 0, 0
        for end in range(c + 1, len(classes) + 1):
            events += classes[end - 1][1]
            widest = max(widest, classes[end - 1][2])
            cost = -(-events // per_block) * block_cost + events * size * widest + best[end]
            if best[c] < 0 or cost < best[c]:
                best[c], cut[c] = cost, end
    groups = []
    c = 0
    while c < len(classes):
        last = classes[cut[c] - 1]
        groups.append((classes[c][0], last[0] + last[1]))
        c = cut[c]
    return groups


def _position_groups(pos: Any, offsets: Any, node_event: Any, groups: Any,
                     group_count: int | None) -> tuple[Any, Any, Any, Any]:
    """Each node's group as a dense row (``slot``, ascending event by event; None without
    ``groups``: each node its own group), each group's position, the CSR offsets of groups
    per event, and whether ``groups`` kept its contract (a 0-d bool tensor, read on the host
    with the counts)."""
    import torch

    device = pos.device
    nodes, events = pos.shape[0], offsets.shape[0] - 1
    if groups is None:
        # Each node its own group: the groups' offsets are the nodes'.
        return None, pos, offsets, torch.ones((), dtype=torch.bool, device=device)
    groups = groups.long()
    if groups.shape != (nodes,):
        raise ValueError(f"knn_edges: groups must have one id per node ({nodes}), not shape "
                         f"{tuple(groups.shape)}")
    if group_count is None:
        group_count = int(groups.max()) + 1 if nodes else 0
    present = torch.zeros(group_count, dtype=torch.bool, device=device)
    present[groups] = True
    slot = torch.cumsum(present, 0)[groups] - 1
    # Groups number at most the nodes: sized by N, the rows past the last group stay unused
    # (their event is `events`, past every real one).
    group_event = torch.full((nodes,), events, dtype=torch.int64, device=device)
    group_event[slot] = node_event
    group_pos = torch.zeros(nodes, 3, dtype=torch.float32, device=device)
    group_pos[slot] = pos
    group_offsets = torch.zeros(events + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.bincount(group_event, minlength=events + 1)[:events], 0,
                 out=group_offsets[1:])
    consistent = ((group_event[slot] == node_event).all() & (group_pos[slot] == pos).all()
                  & (group_event.diff() >= 0).all())
    return slot, group_pos, group_offsets, consistent


def _padded_size(n: int) -> int:
    """``n`` rounded up to a multiple of a quarter of the power of two below it (8 at least):
    events of similar size share a distance block, padding less than a plain power of two."""
    if n <= 8:
        return 8
    step = 1 << max(1, (n - 1).bit_length() - 3)
    return -(-n // step) * step


class _EventBlock:
    """Events whose kNN is computed together: their first node row and node count, first
    group row and group count (tensors on the nodes' device), the node count they are padded
    to and their largest group count (host integers)."""

    def __init__(self, starts: Any, counts: Any, group_starts: Any, group_counts: Any,
                 size: int, width: int) -> None:
        self.starts, self.counts, self.size = starts, counts, size
        self.group_starts, self.group_counts, self.width = group_starts, group_counts, width


def _distances_at_once(device: Any) -> bool:
    """Whether a block's squared distances take one operation per step for all three axes
    (a GPU, where each operation is a launch) rather than one per axis (the CPU, where a
    working set a third the size stays in cache: 12% faster on an uncut 20k-pulse event)."""
    return bool(device.type == "cuda")


def _squared_distances(queries: Any, nodes: Any) -> Any:
    """``(dx*dx + dy*dy) + dz*dz`` in float32 ``[E, C, S]`` between queries ``[3, E, C]`` and
    nodes ``[3, E, S]``; the same bits either way :func:`_distances_at_once` chooses."""
    if _distances_at_once(queries.device):
        square = queries[:, :, :, None] - nodes[:, :, None, :]  # [3, E, C, S]
        square.mul_(square)
        return (square[0] + square[1]).add_(square[2])
    distance = None
    for axis in range(3):
        delta = queries[axis][:, :, None] - nodes[axis][:, None, :]
        square = delta.mul_(delta)
        distance = square if distance is None else distance.add_(square)
    return distance


def _knn_block(planes: Any, slot: Any, group_planes: Any, block: _EventBlock, k: int,
               edge_before: Any, edge_index: Any) -> None:
    """Edges of one block of events into ``edge_index`` (node i's from column
    ``edge_before[i] + 1``; dropped candidates to its last column): the nearest ``k + 1``
    nodes of each group (its own nodes included), then for each node those of its group but
    itself. ``planes`` / ``group_planes``: node / group coordinates ``[3, N]``; ``slot``:
    each node's group row, or None when each node is its own group (then a group's list is
    its node's). Query groups go in chunks of at most ``_knn_block_elements`` pairs."""
    import torch

    device = planes.device
    size, width = block.size, block.width
    events = block.starts.shape[0]
    column = torch.arange(size, device=device)
    starts, counts = block.starts, block.counts
    valid = column[None, :] < counts[:, None]
    rows = torch.where(valid, starts[:, None] + column[None, :], 0)
    nodes = planes[:, rows]  # [3, E, S]
    # Every event has at most `width` groups, and no more groups than nodes: width <= size.
    if slot is None:
        queries = nodes[:, :, :width]
        # The nodes with edges: the first `width` columns (the block's largest event's).
        node_valid, node_rows, node_column = valid[:, :width], rows[:, :width], column[:width]
    else:
        group_column = column[:width]
        group_rows = torch.where(group_column[None, :] < block.group_counts[:, None],
                                 block.group_starts[:, None] + group_column[None, :], 0)
        queries = group_planes[:, group_rows]  # [3, E, W]
        node_valid, node_rows, node_column = valid, rows, column
    invalid_key = torch.iinfo(torch.int64).max
    take = min(k + 1, size)
    chunk = max(1, _knn_block_elements(device) // (events * size))
    padding = ~valid[:, None, :]
    nearest = []
    for r0 in range(0, width, chunk):
        distance = _squared_distances(queries[:, :, r0:r0 + chunk], nodes)
        # (float bits, column) as one int64: distances are >= 0, so their bits order them.
        key = distance.view(torch.int32).to(torch.int64).bitwise_left_shift_(32)
        key.bitwise_or_(column).masked_fill_(padding, invalid_key)
        nearest.append(torch.topk(key, take, dim=2, largest=False, sorted=True).values)
    group_nearest = nearest[0] if len(nearest) == 1 else torch.cat(nearest, dim=1)
    if slot is None:
        candidates = group_nearest  # [E, W, take]: each node's own list
    else:
        # Each node reads its group's list and drops itself.
        node_group = torch.where(valid, slot[rows] - block.group_starts[:, None], 0)
        candidates = group_nearest.gather(1, node_group[:, :, None].expand(-1, -1, take))
    neighbour_column = candidates & 0xFFFFFFFF
    usable = ((candidates != invalid_key) & (neighbour_column != node_column[None, :, None])
              & node_valid[:, :, None])
    rank = torch.cumsum(usable, dim=2)
    usable &= rank <= k
    target = torch.where(usable, edge_before[node_rows][:, :, None] + rank,
                         edge_index.shape[1] - 1)
    neighbour = neighbour_column + starts[:, None, None]
    edge_index[0].index_put_((target,), neighbour)
    edge_index[1].index_put_((target,), node_rows[:, :, None].expand_as(neighbour))
