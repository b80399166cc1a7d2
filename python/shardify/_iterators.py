"""The rule that a loader is one stream of batches: the newest ``iter(loader)`` holds it."""

from __future__ import annotations

from collections.abc import Callable

#: What an iterator says when a newer one took its loader over.
SUPERSEDED = (
    "this iterator's loader was iterated again (a newer iter(loader) or for loop took it "
    "over): a loader hands out one stream of batches, the newest iterator's; for two "
    "independent streams, make two loaders"
)


def check_current(current: Callable[[], bool]) -> None:
    """Raises ``RuntimeError`` when ``current()`` says a newer ``iter(loader)`` took this
    iterator's loader over; else returns None (falsy, so that a ``while`` condition can
    call it before the batch)."""
    if not current():
        raise RuntimeError(SUPERSEDED)
