"""torch samplers that stand for a loader where frameworks look for a ``DataLoader``'s
sampler: PyTorch Lightning calls its ``set_epoch`` at every epoch's start, and GraphNeT's
``predict_as_dataframe`` asks for a ``SequentialSampler`` before it joins attributes to
predictions. Imported only when a framework asks (it imports torch)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch.utils.data

if TYPE_CHECKING:
    from ._loader import Loader


class DrawnOrderSampler(torch.utils.data.Sampler[int]):
    """A shuffling loader's sampler: ``set_epoch`` is the loader's. The loader draws its
    own order, so iterating this sampler is refused."""

    def __init__(self, loader: Loader):
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        """The loader's :meth:`shardify.Loader.set_epoch`."""
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        raise TypeError("a shardify.Loader draws its own order: iterate the loader, not its "
                        "sampler")

    def __len__(self) -> int:
        """The dataset's events."""
        return len(self.loader.dataset)


class StoredOrderSampler(torch.utils.data.SequentialSampler):
    """A loader without shuffle's sampler: the dataset's positions in stored order (what
    the loader delivers, rank by rank), and ``set_epoch`` the loader's."""

    def __init__(self, loader: Loader):
        super().__init__(loader.dataset)
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        """The loader's :meth:`shardify.Loader.set_epoch`."""
        self.loader.set_epoch(epoch)
