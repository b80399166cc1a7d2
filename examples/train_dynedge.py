#!/usr/bin/env python3
"""Train a DynEdge-shaped GNN on a shardify dataset: pulses as nodes, GraphNeT's features.

    python examples/train_dynedge.py DATASET [--epochs 1] [--device auto] [--batch-events 256]
           [--max-pulses 256] [--keep non_auxiliary_first] [--knn 8] [--width 1.0]
           [--warmup 3] [--checkpoint ckpt.pt] [--checkpoint-every 200] [--resume]
           [--stop-after N]

Each batch goes through ``shardify.torch_geometric.to_pyg(batch, standardize="graphnet",
knn=8, max_pulses=...)`` on its device: pulses in time order, cut to ``--max-pulses``
(non-auxiliary first), GraphNeT IceCubeKaggle's scaling, kNN edges in x, y, z. The model
follows GraphNeT's DynEdge (src/graphnet/models/gnn/dynedge.py): global variables (the
event's mean features, the xyzt homophily of its edges, log10(n_pulses)) appended to every
node, four EdgeConv blocks (sum aggregation) that rebuild the kNN graph on the first three
latent features after each block, skip concatenation, a post-processing MLP, min/max/mean
pooling per event and a readout to a unit direction; the loss is 1 - cos(angle). ``--width``
scales every layer (1.0: GraphNeT's sizes).

It prints events/s, the time waiting for data, and the adapter's share of each step (the
time in ``to_pyg``, against the model's forward, backward and optimiser step), per batch, in
the steady state: the first ``--warmup`` steps are reported apart (on a GPU they load CUDA's
kernels and libraries and grow the allocator's pools: on an H200 the first 40 steps averaged
55 ms of adapter per batch where the adapter takes 3.8 ms warm).
Checkpoints hold the model, the optimiser and ``loader.state_dict()``, as train_torch.py's.
"""

from __future__ import annotations

import argparse

import adapted_training
import torch
from adapted_training import angular_loss
from shardify.torch_geometric import to_pyg
from shardify.transforms import choose_knn, knn_edges
from torch import nn


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=False):
        layers += [nn.Linear(n_in, n_out), nn.LeakyReLU()]
    return nn.Sequential(*layers)


class DynEdgeConv(nn.Module):
    """EdgeConv (h(x_i, x_j - x_i) summed over i's neighbours j), then the kNN graph rebuilt
    on the first three output features, as GraphNeT's DynEdgeConv."""

    def __init__(self, sizes: list[int], k: int):
        super().__init__()
        self.edge = mlp([2 * sizes[0]] + sizes[1:])
        self.k = k

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                ptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        source, target = edge_index
        messages = self.edge(torch.cat([x[target], x[source] - x[target]], dim=1))
        out = torch.zeros(x.shape[0], messages.shape[1], dtype=x.dtype, device=x.device)
        out.index_add_(0, target, messages)
        return out, knn_edges(out[:, :3].detach(), ptr, self.k)


class DynEdge(nn.Module):
    """DynEdge's shape: global variables, four DynEdgeConv blocks, skip concatenation,
    post-processing, min/max/mean pooling, readout, a direction head."""

    def __init__(self, features: int, k: int = 8, width: float = 1.0):
        super().__init__()

        def w(n: int) -> int:
            return max(4, int(n * width))

        globals_ = features + 5  # mean features, 4 homophilies, log10(n_pulses)
        n_in = features + globals_
        self.convs = nn.ModuleList()
        skip = n_in
        for _ in range(4):
            self.convs.append(DynEdgeConv([n_in, w(128), w(256)], k))
            n_in = w(256)
            skip += n_in
        self.post = mlp([skip, w(336), w(256)])
        self.readout = mlp([3 * w(256), w(128)])
        self.head = nn.Linear(w(128), 3)

    def forward(self, graphs) -> torch.Tensor:
        x, edge_index, batch, ptr = graphs.x, graphs.edge_index, graphs.batch, graphs.ptr
        events = ptr.shape[0] - 1
        counts = ptr.diff().clamp(min=1).to(x.dtype)[:, None]
        mean = torch.zeros(events, x.shape[1], dtype=x.dtype, device=x.device)
        mean.index_add_(0, batch, x)
        mean = mean / counts
        # xyzt homophily: per event, the fraction of edges joining equal x, y, z, time.
        same = (x[edge_index[0], :4] == x[edge_index[1], :4]).to(x.dtype)
        homophily = torch.zeros(events, 4, dtype=x.dtype, device=x.device)
        homophily.index_add_(0, batch[edge_index[1]], same)
        edges = torch.zeros(events, dtype=x.dtype, device=x.device)
        edges.index_add_(0, batch[edge_index[1]], torch.ones_like(same[:, 0]))
        homophily = homophily / edges.clamp(min=1)[:, None]
        log_pulses = torch.log10(graphs.n_pulses.clamp(min=1))[:, None]
        global_vars = torch.cat([mean, homophily, log_pulses], dim=1)
        x = torch.cat([x, global_vars[batch]], dim=1)
        skips = [x]
        for conv in self.convs:
            x, edge_index = conv(x, edge_index, ptr)
            skips.append(x)
        x = self.post(torch.cat(skips, dim=1))
        index = batch[:, None].expand_as(x)
        pooled = []
        for reduce in ("amin", "amax", "mean"):
            out = torch.zeros(events, x.shape[1], dtype=x.dtype, device=x.device)
            pooled.append(out.scatter_reduce(0, index, x, reduce, include_self=False))
        return nn.functional.normalize(self.head(self.readout(torch.cat(pooled, dim=1))), dim=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    adapted_training.add_arguments(ap, lr=1e-3,
                                   max_pulses_help="pulses kept per event (0: all)")
    ap.add_argument("--knn", type=int, default=8)
    ap.add_argument("--width", type=float, default=1.0,
                    help="scales every layer (1.0: GraphNeT's DynEdge sizes)")
    args = ap.parse_args()

    loader = adapted_training.labelled_loader(args)
    device = loader.device
    model = DynEdge(6, k=args.knn, width=args.width).to(device)
    optimiser, saved = adapted_training.optimiser_and_checkpoints(args, model, loader)

    # The kNN edges' path (SHARDIFY_KNN): on a GPU with Triton one kernel, for events of at
    # most 256 nodes (the cut below); elsewhere torch operations.
    print(f"{len(loader.dataset)} events, {len(loader)} batches per epoch, on {device}; kNN "
          f"edges by {'the Triton kernel' if choose_knn(device) == 'fused' else 'torch'}")

    def adapt(batch: dict, epoch: int):
        return to_pyg(batch, standardize="graphnet", knn=args.knn,
                      max_pulses=args.max_pulses or None, keep=args.keep, epoch=epoch)

    adapted_training.train(loader, adapt,
                           lambda graphs: angular_loss(model(graphs), graphs.direction),
                           lambda graphs: graphs.num_graphs, optimiser, args, saved.save,
                           "to_pyg")


if __name__ == "__main__":
    main()
