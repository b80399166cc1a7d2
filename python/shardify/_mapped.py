"""A loader whose batches pass through a function: what a training framework takes as its
dataloader, with the loader's length, epochs, sampler and state (``Loader.map``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ._iterators import not_indexed

if TYPE_CHECKING:
    from ._loader import Loader

#: What a mapped loader calls on each batch: ``function(batch, epoch)``.
BatchFunction = Callable[[dict[str, Any], int], Any]


def require_transform_arguments(what: str, transform: Callable[..., Any],
                                arguments: dict[str, Any], *given: Any) -> None:
    """Refuses, as ``TypeError`` naming ``what``, arguments ``transform(batch, *given,
    **arguments)`` would not take, and an ``epoch`` (a loader's transform is given its
    loader's): before a training framework starts, rather than at the first batch."""
    if "epoch" in arguments:
        raise TypeError(f"{what} takes no epoch: each epoch's batches are made with the "
                        "loader's epoch")
    try:
        inspect.signature(transform).bind({}, *given, **arguments)
    except TypeError as e:
        raise TypeError(f"{what}: {e} (it takes {transform.__name__}'s arguments)") from None


def require_packed_torch(what: str, loader: Loader, sections: tuple[str, ...]) -> None:
    """Refuses a loader whose batches a transform of packed torch batches (reading
    ``sections``) cannot take: numpy output, the padded layout, no DOM positions."""
    if loader.output != "torch":
        raise TypeError(f'{what} needs torch tensors: make the loader with output="torch" '
                        "(the default)")
    missing = [name for name in sections if name not in loader.section_names]
    if missing:
        raise ValueError(f"{what} needs packed batches with {', '.join(missing)}: make the "
                         'loader with layout="packed" and dom_positions=True (the defaults)')


class MappedLoader:
    """``loader``'s batches, each as ``function(batch, epoch)`` makes it (``epoch``: the
    loader's epoch the batch belongs to, for transforms that draw anew each epoch).

    Everything else is the loader's: its length, epochs, :meth:`set_epoch` (PyTorch
    Lightning's, through :attr:`sampler`), :meth:`state_dict` and :meth:`load_state_dict`,
    so a Lightning checkpoint made at any step resumes the batches left, and under
    Lightning's DDP each rank reads its share. Made by ``shardify.Loader.map``; GraphNeT's
    graphs come from ``shardify.torch_geometric.GraphLoader``, one of these.
    """

    def __init__(self, loader: Loader, function: BatchFunction):
        if not callable(function):
            raise TypeError(f"a mapped loader needs a function(batch, epoch), not "
                            f"{type(function).__module__}.{type(function).__name__}")
        self.loader, self.function = loader, function

    def __iter__(self) -> Iterator[Any]:
        """One epoch of the loader (see ``shardify.Loader.__iter__``), each batch mapped."""
        batches = iter(self.loader)
        epoch, function = self.loader.epoch, self.function
        return (function(batch, epoch) for batch in batches)

    def __len__(self) -> int:
        """The loader's length: its batches in the epoch the next ``for`` runs."""
        return len(self.loader)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.loader.epoch

    def set_epoch(self, epoch: int) -> None:
        """The loader's ``set_epoch``."""
        self.loader.set_epoch(epoch)

    #: None, as a ``DataLoader``'s beside its ``sampler``: what Lightning reads with it.
    batch_sampler: None = None

    @property
    def sampler(self) -> Any:
        """The loader's sampler (see ``shardify.Loader.sampler``): Lightning calls its
        ``set_epoch`` at every epoch's start."""
        return self.loader.sampler

    @property
    def dataset(self) -> Any:
        """The loader's dataset (GraphNeT's ``predict_as_dataframe`` counts its events)."""
        return self.loader.dataset

    def state_dict(self) -> dict[str, Any]:
        """The loader's state: where it stands, its settings, the dataset's identity."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes the loader at ``state`` (see ``shardify.Loader.load_state_dict``)."""
        self.loader.load_state_dict(state)

    def __getitem__(self, index: Any) -> Any:
        """Refused, saying why, as ``shardify.Loader`` refuses it: torch's ``DataLoader``
        given a mapped loader reads it as a map-style dataset and asks for ``mapped[i]``."""
        raise not_indexed(f"a {type(self).__name__}")

    def __repr__(self) -> str:
        name = getattr(self.function, "__qualname__", None) or repr(self.function)
        return f"shardify.MappedLoader({self.loader!r}, {name})"
