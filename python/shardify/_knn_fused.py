""":func:`shardify.transforms.knn_edges` without groups, for events of at most
:data:`MAX_NODES` nodes, as one Triton kernel: a GPU path.

The torch operations of ``knn_edges`` compute a block of events' distances in 31 operations
(each a kernel launch on a GPU) and need two blocks for a 256-event batch cut to 256 pulses
per event: 77 operations with the setup, where this path runs 15 and the kernel. Here one
program holds a few query nodes' keys against every node of their event (at most 256, so in
registers) and takes the k smallest by repeated minimum: one launch for the whole batch. The
keys and the rule are the torch path's: squared Euclidean distances in float32,
``(dx*dx + dy*dy) + dz*dz`` rounded step by step (no fused multiply-add, so the same bits),
ties to the lower row, no self loop, edges written in node order. With
``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, which is how CI checks it against
the reference.
"""

# No `from __future__ import annotations`: Triton's CPU interpreter before 3.2 (torch 2.5
# and older) takes a kernel parameter for a constexpr only where its annotation is
# `tl.constexpr` itself, not the string.
from typing import Any

import triton
import triton.language as tl

from ._kernels import compiled_for_any

#: The most nodes an event may have for the kernel: a program holds its queries' keys
#: against every node of the event.
MAX_NODES = 256

#: Keys a program holds at once (queries x the event's padded node count).
_PROGRAM_KEYS = 4096

#: A key no real candidate reaches: padding columns and the query itself (a constexpr: a
#: kernel reads no other global).
_INVALID = tl.constexpr(0x7FFFFFFFFFFFFFFF)


# The node and edge counts change with every batch: compiled for any value of them, rather
# than again for each that Triton would specialise on (a multiple of 16, or 1), at a second
# or so each while its cache is cold (an H200's first 60 steps of train_dynedge.py on a
# fresh machine: 36.9 ms of adapter a batch, 2.9 ms once cached).
@triton.jit(**compiled_for_any(values=["plane_stride", "edge_stride"]))
def _knn_kernel(planes, plane_stride, starts, counts, edge_before, edges, edge_stride,
                K: tl.constexpr, NODES: tl.constexpr, QUERIES: tl.constexpr):
    """Program (event, query block): the edges of ``QUERIES`` nodes of one event."""
    event = tl.program_id(0)
    start = tl.load(starts + event)
    n = tl.load(counts + event)
    query = tl.program_id(1) * QUERIES + tl.arange(0, QUERIES)
    column = tl.arange(0, NODES)
    query_live = query < n
    column_live = column < n
    distance = tl.zeros((QUERIES, NODES), dtype=tl.float32)
    for axis in tl.static_range(3):
        plane = planes + axis * plane_stride + start
        at = tl.load(plane + query, mask=query_live, other=0.0)
        of = tl.load(plane + column, mask=column_live, other=0.0)
        delta = at[:, None] - of[None, :]
        distance = distance + delta * delta
    # (float bits, column) as one int64: distances are >= 0, so their bits order them.
    key = (distance.to(tl.int32, bitcast=True).to(tl.int64) << 32) | column[None, :]
    dropped = ~column_live[None, :] | (column[None, :] == query[:, None])
    key = tl.where(dropped, _INVALID, key)
    before = tl.load(edge_before + start + query, mask=query_live, other=0)
    for rank in tl.static_range(1, K + 1):
        nearest = tl.min(key, axis=1)
        usable = query_live & (nearest != _INVALID)
        target = before + rank
        tl.store(edges + target, start + (nearest & (NODES - 1)), mask=usable)
        tl.store(edges + edge_stride + target, start + query, mask=usable)
        key = tl.where(key == nearest[:, None], _INVALID, key)


def knn_edges_fused(planes: Any, starts: Any, counts: Any, largest: int, k: int,
                    edge_before: Any, edge_index: Any) -> None:
    """Writes every event's edges into ``edge_index`` (node i's from column
    ``edge_before[i] + 1``). ``planes``: node coordinates ``[3, N]`` float32; ``starts``,
    ``counts``: each event's first node and node count (int64, on the nodes' device);
    ``largest``: the largest count (at most :data:`MAX_NODES`, known on the host)."""
    events = starts.shape[0]
    if events == 0 or largest < 2:
        return
    nodes = max(16, triton.next_power_of_2(largest))
    queries = min(64, _PROGRAM_KEYS // nodes)
    grid = (events, triton.cdiv(largest, queries))
    # No fused multiply-add: the distances keep the torch path's bits.
    _knn_kernel[grid](planes, planes.stride(0), starts, counts, edge_before, edge_index,
                      edge_index.stride(0), K=k, NODES=nodes, QUERIES=queries,
                      enable_fp_fusion=False)
