"""The rule that a loader is one stream of batches: the newest ``iter(loader)`` holds it."""

from __future__ import annotations

#: What an iterator says when a newer one took its loader over.
SUPERSEDED = (
    "this iterator's loader was iterated again (a newer iter(loader) or for loop took it "
    "over, or it was made again for the process's new rank, world or device): a loader "
    "hands out one stream of batches, the newest iterator's; for two independent streams, "
    "make two loaders"
)


def not_indexed(what: str) -> TypeError:
    """The refusal of ``what[i]`` (``what``: "a shardify.Loader", "a MappedLoader"): torch's
    ``DataLoader`` given a loader reads it as a map-style dataset (it has a length) and asks
    for item ``i``; the loader is the data loader itself."""
    return TypeError(
        f"{what} is not indexed: it is the data loader itself (a shardify.Loader's threads "
        "gather the batches, in a shuffled order, this rank's share), so iterate it directly "
        "instead of wrapping it in torch.utils.data.DataLoader")
