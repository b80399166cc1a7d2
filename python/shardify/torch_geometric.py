"""PyTorch Geometric / GraphNeT: a packed shardify batch as a PyG ``Batch``.

>>> from shardify.torch_geometric import to_pyg
>>> for batch in shardify.Loader("dataset/", batch_events=256):   # doctest: +SKIP
...     graphs = to_pyg(batch, nodes="pulses")   # one graph per event, no edges yet
...     graphs = knn_graph_transform(graphs)      # GraphNeT/PyG build edges on the device

Nodes are pulses (GraphNeT's convention) or DOMs. Features, in column order:

* ``nodes="pulses"``: x, y, z (the pulse's DOM), time, charge, auxiliary;
* ``nodes="doms"``: x, y, z, pulse count, first pulse time, summed charge, any auxiliary.

``pos`` holds x, y, z; ``batch`` maps each node to its event; ``ptr`` is the CSR of nodes
per event; ``y`` is ``[B, 2]`` (azimuth, zenith) when the dataset has labels, and
``event_id`` is kept. Everything is computed with torch on the batch's device (the packed
batch must carry ``dom_position``, the default). Features are float32.
"""

from __future__ import annotations

from typing import Any


def to_pyg(batch: dict[str, Any], nodes: str = "pulses"):
    """The packed ``batch`` (a dict of torch tensors from ``shardify.Loader``) as a
    ``torch_geometric.data.Batch`` with one graph per event."""
    import torch
    from torch_geometric.data import Batch

    if "dom_position" not in batch:
        raise ValueError("to_pyg needs a packed batch with dom_position (layout=\"packed\", "
                         "dom_positions=True)")
    event_doms = batch["event_dom_offsets"].long()
    dom_pulses = batch["dom_pulse_offsets"].long()
    events = batch["event_id"].shape[0]
    device = event_doms.device
    pulses_per_dom = dom_pulses.diff()
    dom_xyz = batch["dom_position"].to(torch.float32)
    if nodes == "pulses":
        pos = dom_xyz.repeat_interleave(pulses_per_dom, dim=0)
        x = torch.cat([
            pos,
            batch["pulse_time"].to(torch.float32)[:, None],
            batch["pulse_charge"].to(torch.float32)[:, None],
            batch["pulse_auxiliary"].to(torch.float32)[:, None],
        ], dim=1)
        ptr = dom_pulses[event_doms]
    elif nodes == "doms":
        pos = dom_xyz
        dom_of_pulse = torch.arange(pulses_per_dom.numel(), device=device).repeat_interleave(
            pulses_per_dom)
        charge = torch.zeros(pos.shape[0], dtype=torch.float32, device=device)
        charge.index_add_(0, dom_of_pulse, batch["pulse_charge"].to(torch.float32))
        auxiliary = torch.zeros(pos.shape[0], dtype=torch.float32, device=device)
        auxiliary.index_add_(0, dom_of_pulse, batch["pulse_auxiliary"].to(torch.float32))
        auxiliary.clamp_(max=1.0)  # any auxiliary pulse
        first_time = batch["pulse_time"].to(torch.float32)[dom_pulses[:-1].clamp(
            max=max(batch["pulse_time"].numel() - 1, 0))]
        x = torch.cat([pos, pulses_per_dom.to(torch.float32)[:, None], first_time[:, None],
                       charge[:, None], auxiliary[:, None]], dim=1)
        ptr = event_doms
    else:
        raise ValueError(f'invalid nodes: {nodes!r} (expected "pulses" or "doms")')
    counts = ptr.diff()
    graph_of_node = torch.arange(events, device=device).repeat_interleave(counts)
    fields = dict(x=x, pos=pos, batch=graph_of_node, ptr=ptr,
                  edge_index=torch.empty(2, 0, dtype=torch.long, device=device),
                  event_id=batch["event_id"])
    if "event_azimuth" in batch:
        fields["y"] = torch.stack([batch["event_azimuth"], batch["event_zenith"]], dim=1)
    graphs = Batch(**fields)
    graphs._num_graphs = events
    return graphs
