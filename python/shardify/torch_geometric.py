"""PyTorch Geometric / GraphNeT: a packed shardify batch as a PyG ``Batch``.

>>> from shardify.torch_geometric import to_pyg
>>> for batch in shardify.Loader("dataset/", batch_events=256):   # doctest: +SKIP
...     graphs = to_pyg(batch, standardize="graphnet", knn=8)   # what DynEdge reads
...     prediction = model(graphs)

Nodes are pulses (GraphNeT's convention), in time order per event (see
:func:`shardify.transforms.time_ordered`, whose ``max_pulses`` / ``keep`` / ``seed`` /
``epoch`` cut long events), or DOMs. Features, in column order:

* ``nodes="pulses"``: x, y, z (the pulse's DOM), time, charge, auxiliary. With
  ``standardize="graphnet"`` they are scaled exactly as GraphNeT's ``IceCubeKaggle``
  detector does (graphnet-team/graphnet, ``src/graphnet/models/detector/icecube.py``,
  ``IceCubeKaggle.feature_map``): x, y, z / 500; (time - 1e4) / 3e4; log10(charge) / 3;
  auxiliary as is.
* ``nodes="doms"``: x, y, z, pulse count, first pulse time, total charge, charge-weighted
  mean time, any auxiliary (the summaries DOM-level models use). With
  ``standardize="graphnet"``: positions / 500, both times (t - 1e4) / 3e4, log10(total
  charge) / 3, the count and the auxiliary flag as they are.

Other fields: ``pos`` (x, y, z in metres, float32), ``batch`` (node -> event), ``ptr`` (CSR
of nodes per event), ``n_pulses`` ``[B]`` (pulses per graph after any truncation, float32:
GraphNeT's DynEdge reads ``log10(n_pulses)``), for pulse nodes ``pulse_dom`` (the node's
DOM, a row of the batch's DOM sections), ``event_id``, and with labels ``y`` ``[B, 2]`` (azimuth,
zenith), ``azimuth``, ``zenith`` and ``direction`` ``[B, 3]`` = (cos az sin zen,
sin az sin zen, cos zen), as GraphNeT's ``Direction`` label (``src/graphnet/training/
labels.py``). ``knn=k`` adds ``edge_index``: the k nearest nodes in x, y, z within each event
(:func:`shardify.transforms.knn_edges`; GraphNeT's ``KNNEdges`` with k=8 on the first three
features, which /500 scales uniformly: the same neighbours up to ties), else no edges.

Events with 0 or 1 pulses: GraphNeT's collate drops them; here every event stays a graph (0
or 1 node, no edge), so a batch's graphs line up with its ``event_id`` and predictions join
back to every event. ``min_pulses=2`` drops them as GraphNeT does (the Kaggle data has at
least 5 pulses per event, so only truncation to fewer could make such events).

:class:`GraphLoader` is a loader whose batches come as such graphs: the dataloader GraphNeT's
``Model.fit`` and any PyTorch Lightning ``Trainer`` take, with the loader's length, epochs,
``set_epoch`` and ``state_dict`` (Lightning's checkpoints resume it mid-epoch).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ._mapped import MappedLoader, require_packed_torch, require_transform_arguments

if TYPE_CHECKING:
    from ._loader import Loader

from .transforms import (
    PACKED_SECTIONS,
    STANDARDIZATIONS,
    _features_and_positions,
    _left_untraced,
    _require_packed,
    choose_knn,
    graphnet_charge,
    graphnet_time,
    graphnet_xyz,
    knn_edges,
    require_standardization,
    time_ordered,
)

# The scalings (STANDARDIZATIONS, graphnet_*) are the transforms': pulse_features shares
# them with sequence models. Imported here, they keep their names in this module too.
__all__ = ["PACKED_SECTIONS", "STANDARDIZATIONS", "GPU_PULSE_DISTANCES_MAX", "GraphLoader",
           "direction", "distances_per_dom", "graphnet_charge", "graphnet_time", "graphnet_xyz",
           "to_pyg"]

#: On a GPU, pulse nodes cut to at most this many per event get their kNN distances per
#: pulse rather than per DOM: the edges are the same, and an event's pairs (at most 256^2)
#: cost the GPU less than the 23 torch operations, each a launch, that group the pulses by
#: DOM (an H200, batches of 256 events cut to 256 pulses: 2.26 / 2.88 ms per pulse against
#: 2.53 / 3.29 ms per DOM in two runs, docs/results.md). Longer or uncut events, and the CPU
#: (1.5x faster per DOM at the same cut), group by DOM, unless ``SHARDIFY_KNN=fused``
#: chooses the Triton kernel there, which computes per pulse (events of at most 256 nodes;
#: on a GPU it is the default where Triton serves it).
GPU_PULSE_DISTANCES_MAX = 256


def distances_per_dom(device: Any, max_pulses: int | None) -> bool:
    """Whether ``to_pyg`` computes the kNN distances of pulse nodes on ``device``, cut to
    ``max_pulses`` per event (None: uncut), once per DOM (else once per pulse)."""
    if max_pulses is None or max_pulses > GPU_PULSE_DISTANCES_MAX:
        return True
    return device.type != "cuda" and choose_knn(device) != "fused"


def direction(azimuth: Any, zenith: Any) -> Any:
    """Unit vectors ``[B, 3]`` from azimuth and zenith, as GraphNeT's ``Direction`` label."""
    import torch

    sin_zenith = torch.sin(zenith)
    return torch.stack([torch.cos(azimuth) * sin_zenith, torch.sin(azimuth) * sin_zenith,
                        torch.cos(zenith)], dim=1)


@_left_untraced
def to_pyg(batch: dict[str, Any], nodes: str = "pulses", *, standardize: str | None = None,
           knn: int | None = None, max_pulses: int | None = None,
           keep: str = "non_auxiliary_first", seed: int = 0, epoch: int = 0,
           min_pulses: int = 0) -> Any:
    """The packed ``batch`` (a dict of torch tensors from ``shardify.Loader``) as a
    ``torch_geometric.data.Batch`` with one graph per event (see the module's docs).

    ``nodes``: ``"pulses"`` or ``"doms"``. ``standardize``: None (raw units, float32) or
    ``"graphnet"``. ``knn``: k for kNN edges, or None for none. ``max_pulses``, ``keep``,
    ``seed``, ``epoch``: pulse truncation, as :func:`shardify.transforms.time_ordered`
    (pulse nodes only). ``min_pulses``: events with fewer pulses (after truncation) are
    left out (GraphNeT's collate: 2); 0 keeps every event.
    """
    import torch
    from torch_geometric.data import Batch

    _require_packed(batch, "to_pyg")
    if isinstance(min_pulses, bool) or not isinstance(min_pulses, int) or min_pulses < 0:
        raise ValueError(f"min_pulses must be a non-negative integer, not {min_pulses!r}")
    require_standardization(standardize)
    if nodes == "pulses":
        fields = _pulse_nodes(batch, standardize, max_pulses, keep, seed, epoch)
    elif nodes == "doms":
        if max_pulses is not None:
            raise ValueError("max_pulses applies to pulse nodes (nodes=\"pulses\")")
        fields = _dom_nodes(batch, standardize)
    else:
        raise ValueError(f'invalid nodes: {nodes!r} (expected "pulses" or "doms")')
    ptr, pulse_counts = fields.pop("ptr"), fields.pop("pulse_counts")
    labels = {}
    if "event_azimuth" in batch:
        azimuth, zenith = batch["event_azimuth"], batch["event_zenith"]
        labels = dict(y=torch.stack([azimuth, zenith], dim=1), azimuth=azimuth, zenith=zenith,
                      direction=direction(azimuth, zenith))
    event_id = batch["event_id"]
    if min_pulses > 0:
        # Data-dependent: one host synchronisation.
        chosen = (pulse_counts >= min_pulses).nonzero().flatten()
        node_keep = torch.repeat_interleave(pulse_counts >= min_pulses, ptr.diff())
        fields = {k: v[node_keep] for k, v in fields.items()}
        ptr = torch.cat([ptr[:1] * 0, ptr.diff()[chosen].cumsum(0)])
        pulse_counts, event_id = pulse_counts[chosen], event_id[chosen]
        labels = {k: v[chosen] for k, v in labels.items()}
    counts = ptr.diff()
    # Each graph's index, repeated for its nodes.
    node_graph = torch.repeat_interleave(counts.long(), output_size=fields["x"].shape[0])
    if knn is None:
        edge_index = torch.empty(2, 0, dtype=torch.long, device=ptr.device)
    elif "pulse_dom" in fields and distances_per_dom(ptr.device, max_pulses):
        # Pulses of one DOM share its position: distances once per DOM.
        edge_index = knn_edges(fields["pos"], ptr, knn, groups=fields["pulse_dom"],
                               group_count=batch["dom_position"].shape[0])
    else:
        edge_index = knn_edges(fields["pos"], ptr, knn)
    out = Batch(**fields, batch=node_graph, ptr=ptr, edge_index=edge_index, event_id=event_id,
                n_pulses=pulse_counts.to(torch.float32), **labels)
    out._num_graphs = ptr.shape[0] - 1
    return out


def _pulse_nodes(batch: dict[str, Any], standardize: str | None, max_pulses: int | None,
                 keep: str, seed: int, epoch: int) -> dict[str, Any]:
    pulses = time_ordered(batch, max_pulses=max_pulses, keep=keep, seed=seed, epoch=epoch)
    x, pos = _features_and_positions(pulses, standardize)
    ptr = pulses["event_pulse_offsets"]
    return dict(x=x, pos=pos, ptr=ptr, pulse_counts=ptr.diff(), pulse_dom=pulses["pulse_dom"])


def _dom_nodes(batch: dict[str, Any], standardize: str | None) -> dict[str, Any]:
    import torch

    event_doms = batch["event_dom_offsets"].long()
    dom_pulses = batch["dom_pulse_offsets"].long()
    pos = batch["dom_position"].to(torch.float32)
    doms, pulses = pos.shape[0], batch["pulse_time"].shape[0]
    device = pos.device
    pulses_per_dom = dom_pulses.diff()
    pulse_dom = torch.repeat_interleave(pulses_per_dom, output_size=pulses)
    time = batch["pulse_time"].to(torch.float32)
    charge = batch["pulse_charge"].to(torch.float32)

    def per_dom(values: Any, reduce: str) -> Any:
        out = torch.zeros(doms, dtype=torch.float32, device=device)
        return out.scatter_reduce_(0, pulse_dom, values, reduce, include_self=False)

    total_charge = per_dom(charge, "sum")
    first_time = per_dom(time, "amin")
    weighted_time = per_dom(time * charge, "sum") / total_charge
    auxiliary = per_dom(batch["pulse_auxiliary"].to(torch.float32), "amax")
    count = pulses_per_dom.to(torch.float32)
    if standardize == "graphnet":
        columns = [graphnet_xyz(pos), count, graphnet_time(first_time),
                   graphnet_charge(total_charge), graphnet_time(weighted_time), auxiliary]
    else:
        columns = [pos, count, first_time, total_charge, weighted_time, auxiliary]
    x = torch.cat([c if c.dim() == 2 else c[:, None] for c in columns], dim=1)
    ptr = event_doms
    return dict(x=x, pos=pos, ptr=ptr, pulse_counts=dom_pulses[event_doms].diff())


def _warn_of_a_budget_of_other_pulses(loader: Loader, to_pyg_arguments: dict[str, Any]) -> None:
    """Warns when ``loader``'s pulse budget counts other pulses than the graphs' nodes: each
    event's pulses up to the loader's ``pulse_cap`` against the ``max_pulses`` that
    :func:`to_pyg` keeps. Counting more, the batches hold fewer nodes than the budget (with
    the real statistics cut to 256, uncapped: 52-58% of it); counting fewer, more."""
    arguments = getattr(loader, "_arguments", {})
    budget, cap = arguments.get("max_pulses"), arguments.get("pulse_cap")
    kept = to_pyg_arguments.get("max_pulses")
    if budget is None or cap == kept or to_pyg_arguments.get("nodes", "pulses") != "pulses":
        return
    counted = "all of" if cap is None else f"up to pulse_cap={cap} of"
    graphs = "all their pulses" if kept is None else f"at most max_pulses={kept} pulses an event"
    effect = ("fewer nodes than the budget" if kept is not None and (cap is None or cap > kept)
              else "more nodes than the budget")
    fix = (f"; make the loader with pulse_cap={kept}" if kept is not None
           else f"; give GraphLoader max_pulses={cap}, or make the loader without pulse_cap")
    warnings.warn(f"GraphLoader: the loader's budget of max_pulses={budget} counts {counted} "
                  f"each event's pulses, while its graphs keep {graphs}: batches of {effect}"
                  f"{fix}", UserWarning, stacklevel=3)


class GraphLoader(MappedLoader):
    """``loader``'s batches as :func:`to_pyg` graphs, made with ``to_pyg_arguments``
    (``nodes``, ``standardize``, ``knn``, ``max_pulses``, ``keep``, ``seed``,
    ``min_pulses``; ``epoch`` is the loader's, so ``keep="random"`` draws anew each epoch).

    The dataloader GraphNeT's ``Model.fit`` and a PyTorch Lightning ``Trainer`` take:

    >>> train = GraphLoader(shardify.Loader("dataset/"), standardize="graphnet", knn=8)
    >>> model.fit(train, max_epochs=10)   # doctest: +SKIP

    Length, epochs, :meth:`set_epoch` (Lightning's, through :attr:`sampler`),
    :meth:`state_dict` and :meth:`load_state_dict` are the loader's (a
    :class:`shardify.MappedLoader`): a Lightning checkpoint made at any step resumes the
    batches left, and under Lightning's DDP each rank reads its share (the loader finds its
    rank when first used). A loader batched by a pulse budget should count each event's
    pulses as its graph keeps them (``Loader(max_pulses=P, pulse_cap=C)`` with
    ``max_pulses=C`` here); it warns otherwise.
    """

    def __init__(self, loader: Loader, **to_pyg_arguments: Any):
        require_transform_arguments("GraphLoader", to_pyg, to_pyg_arguments)
        require_packed_torch("GraphLoader", loader, PACKED_SECTIONS)
        _warn_of_a_budget_of_other_pulses(loader, to_pyg_arguments)
        self.to_pyg_arguments = to_pyg_arguments
        super().__init__(loader, self._graphs)

    def _graphs(self, batch: dict[str, Any], epoch: int) -> Any:
        return to_pyg(batch, epoch=epoch, **self.to_pyg_arguments)

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.to_pyg_arguments.items())
        return f"shardify.torch_geometric.GraphLoader({self.loader!r}, {arguments})"
