"""The rule that a loader is one stream of batches: the newest ``iter(loader)`` holds it."""

from __future__ import annotations

from collections.abc import Callable

#: What an iterator says when a newer one took its loader over.
SUPERSEDED = (
    "this iterator's loader was iterated again (a newer iter(loader) or for loop took it "
    "over, or it was made again for the process's new rank, world or device): a loader "
    "hands out one stream of batches, the newest iterator's; for two independent streams, "
    "make two loaders"
)


def check_current(current: Callable[[], bool]) -> None:
    """Raises ``RuntimeError`` when ``current()`` says this iterator's loader moved on
    without it (a newer ``iter(loader)``, or the loader made again)."""
    if not current():
        raise RuntimeError(SUPERSEDED)
