"""Resident mode (``shardify.Loader(..., resident=True)``): the whole dataset held in device
memory as concatenated columns, each batch gathered there.

* :mod:`.columns` loads the shards into the columns (and says, before allocating, when they
  cannot fit);
* :mod:`.source` takes the epoch's plan from the Rust sampler and hands out batches;
* :mod:`.gather` is the gather as torch operations (the reference and the CPU path),
  :mod:`.fused` the same gather as Triton kernels (the GPU path);
* :mod:`.buffers` holds the output buffers, reused once nothing views them.
"""

from .source import ResidentBatches, layout_of

__all__ = ["ResidentBatches", "layout_of"]
