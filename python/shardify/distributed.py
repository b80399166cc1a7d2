"""Several ranks: a loss over every rank's events, and the ranks' predictions put together.

**Training.** Batches cut by a budget (``max_pulses`` or ``max_tokens``) hold different
numbers of events on the ranks of one step, and ``DistributedDataParallel`` averages the
ranks' gradients, each rank's weighing the same: with every rank's mean loss, an event in a
small batch weighs more than one in a big batch (with a token budget, a long event several
times a short one). :func:`event_mean` is the loss that weighs every event of the step the
same, as fairseq divides a step's summed loss by the sample size summed over its ranks.

**Evaluation.** With ``shardify.Loader(..., shuffle=False)`` every rank gets its share of
the dataset, each event exactly once over all ranks, in stored order, the last partial batch
kept; ranks may then get unequal numbers of batches (one more for the first ranks), which is
fine for inference (no collective per batch) but means the per-rank results have unequal
lengths. :func:`gather_predictions` concatenates them over ranks, whatever their lengths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def event_mean(values: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The loss of a data-parallel step that weighs every event of every rank the same:
    this rank's ``values`` ``[n_r]`` (one per event of its batch) summed, times the world
    size, over the events of all ranks in this step (``sum(values) * W / sum(n_r)``). Once
    ``DistributedDataParallel`` averaged the ranks' gradients (over ``group``, which must be
    its process group), they are those of the mean over all ``sum(n_r)`` events, as one
    process would compute it on the step's events together. Every rank calls it once per
    step (an ``all_reduce`` of the event count: on GPU tensors it is queued on the stream,
    no host synchronisation). Without an initialised process group, ``values.mean()``.
    Half-precision values are summed in float32, and the loss is float32: a step of more
    than 65,504 events would overflow a float16 count.

    With batches of a fixed count the ranks' counts are equal (``drop_last``) and this is
    each rank's mean; with a ``max_pulses`` or ``max_tokens`` budget they are not."""
    import torch
    import torch.distributed as dist

    if values.dim() != 1:
        raise ValueError(f"values of shape {tuple(values.shape)}: give one value per event "
                         "([n] events)")
    if values.dtype not in (torch.float32, torch.float64):
        values = values.float()
    if not (dist.is_available() and dist.is_initialized()):
        return values.mean()
    # A fill on the device, not a copy from the host (which would wait for the stream).
    count = torch.full((1,), values.shape[0], dtype=torch.int64, device=values.device)
    dist.all_reduce(count, group=group)
    world = dist.get_world_size(group)
    return values.sum() * world / count.clamp(min=1).to(values.dtype)[0]


def gather_predictions(event_id: torch.Tensor, *values: torch.Tensor, group: Any = None,
                       check_unique: bool = True) -> tuple[torch.Tensor, ...]:
    """Every rank's ``event_id`` ``[n_r]`` and ``values`` (each ``[n_r, ...]``), concatenated
    over the ranks of ``group`` in rank order, on every rank (``all_gather``: gloo on CPU
    tensors, NCCL on GPU ones). Without an initialised process group, the inputs as they
    are. With ``check_unique`` a ``ValueError`` names an event id that came twice (the
    metric of an evaluation that counts an event twice is wrong)."""
    import torch
    import torch.distributed as dist

    for v in values:
        if v.shape[0] != event_id.shape[0]:
            raise ValueError(f"values of {v.shape[0]} rows beside {event_id.shape[0]} event ids")
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size(group)
        count = torch.tensor([event_id.shape[0]], device=event_id.device)
        counts = [torch.zeros_like(count) for _ in range(world)]
        dist.all_gather(counts, count, group=group)
        sizes = [int(c) for c in counts]
        gathered = []
        for t in (event_id, *values):
            padded = t.new_zeros((max(sizes), *t.shape[1:]))
            padded[:t.shape[0]] = t
            parts = [torch.empty_like(padded) for _ in range(world)]
            dist.all_gather(parts, padded, group=group)
            gathered.append(torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)]))
        out = tuple(gathered)
    else:
        out = (event_id, *values)
    if check_unique:
        ids = out[0]
        ordered = ids.sort().values
        repeated = (ordered[1:] == ordered[:-1]).nonzero()
        if repeated.numel():
            raise ValueError(f"event id {int(ordered[repeated[0, 0]])} came twice: the ranks' "
                             "shares overlap (a shuffled loader with drop_last=False, or the "
                             "same rank twice?)")
    return out
