"""Sequence models: a loader whose batches come as padded pulse sequences.

>>> from shardify.sequences import SequenceLoader
>>> train = SequenceLoader(shardify.Loader("dataset/", group_by_length=256,   # doctest: +SKIP
...                                        max_tokens=65536), standardize="graphnet")
>>> for grid in train:                                                        # doctest: +SKIP
...     prediction = model(grid["pulse_features"], grid["pulse_mask"])

Each batch is :func:`shardify.transforms.pulse_sequences` of the loader's batch, made with
the loader's epoch. A token budget (``Loader(max_tokens=T, group_by_length=L)``) bounds each
grid at T cells only when the grids are cut and padded as the budget counted them: cut to
L pulses, padded to each batch's longest event, rounded up only as the budget rounds it
(``Loader(..., pad_to_multiple_of=M)``). :class:`SequenceLoader` takes those as its
defaults, and warns, before any batch is read, of the settings that make grids overrun the
budget or fill less of it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ._loader import _length_grouping
from ._mapped import MappedLoader, require_packed_torch, require_transform_arguments
from .transforms import PACKED_SECTIONS, pulse_sequences, require_sequence_arguments

if TYPE_CHECKING:
    from ._loader import Loader


def _pulse_cap(arguments: dict[str, Any]) -> int | None:
    """The pulses a loader made with ``arguments`` groups events by at most: its
    ``group_by_length`` cap when it groups by pulse count; None otherwise (no grouping, an
    uncapped one, or one by DOM count)."""
    cap = _length_grouping(arguments.get("group_by_length", False))[1]
    return cap if arguments.get("length_of", "pulses") == "pulses" else None


def _budget_mismatches(arguments: dict[str, Any], length: int,
                       sequence_arguments: dict[str, Any]) -> list[str]:
    """How grids of ``pulse_sequences(batch, length, **sequence_arguments)`` break the
    budget the loader (made with ``arguments``) batches by: each a cause, its effect and
    its fix. Empty when they hold at most ``max_tokens`` cells and fill it as the budget
    counted; without a budget, when the grouping (if any) sorts events by the lengths the
    grids keep."""
    padding = sequence_arguments.get("padding", "length")
    multiple = sequence_arguments.get("pad_to_multiple_of")
    if arguments.get("max_pulses") is not None:
        return [f"the loader's budget of max_pulses={arguments['max_pulses']} bounds a "
                "batch's pulses, not its padded grid (its events times its longest event), "
                "so grids of many short events and one long one overrun it; make the loader "
                f"with group_by_length={length} and max_tokens (a budget of padded cells)"]
    budget = arguments.get("max_tokens")
    cap = _pulse_cap(arguments)
    if budget is None:
        if cap is None or cap >= length or padding != "longest":
            return []
        return [f"the loader groups events by up to group_by_length={cap} of their pulses, "
                f"while the grids keep up to {length}: a batch of its longest class holds "
                f"events of {cap} to {length} pulses, padded to the longest; make the loader "
                f"with group_by_length={length}"]
    found = []
    if budget < length:
        found.append(f"the loader's max_tokens={budget} is less than the {length} pulses the "
                     f"grids keep: an event longer than {budget} pulses forms a batch alone, "
                     f"a grid of up to {length} cells, over the budget; make the loader with "
                     f"max_tokens of at least {length}, or with group_by_length={budget} and "
                     f"cut the sequences to {budget}")
    if arguments.get("length_of", "pulses") != "pulses":
        found.append(f"the loader's max_tokens={budget} counts DOM rows (length_of="
                     f"{arguments['length_of']!r}), while the grids hold pulses: grids of "
                     "other sizes than the budget; make the loader with length_of=\"pulses\" "
                     f"and group_by_length={length}")
    elif cap is None or cap > length:
        counted = "all of" if cap is None else f"up to group_by_length={cap} of"
        found.append(f"the loader's max_tokens={budget} counts {counted} each event's pulses, "
                     f"while the grids keep at most {length}: batches of fewer events than "
                     f"fit, more steps; make the loader with group_by_length={length}")
    elif cap < length:
        found.append(f"the loader's max_tokens={budget} counts up to group_by_length={cap} "
                     f"of each event's pulses, while the grids keep up to {length}: grids of "
                     f"up to {length / cap:.3g}x the budget; make the loader with "
                     f"group_by_length={length}, or cut the sequences to {cap}")
    if padding != "longest":
        found.append(f'padding={padding!r} pads every batch to {length} pulses, while '
                     f"max_tokens={budget} counts each batch's longest event: batches of short "
                     f"events overrun the budget; pad with padding=\"longest\" (the default "
                     "here)")
    else:
        found.extend(_rounding_mismatch(budget, arguments.get("pad_to_multiple_of"), multiple))
    return found


def _rounding_mismatch(budget: int, counted: int | None, padded: int | None) -> list[str]:
    """How grids padded to their longest event rounded up to a multiple of ``padded`` break
    a budget that counts it rounded up to a multiple of ``counted`` (None: not rounded)."""
    counted_width = ("the longest event" if counted in (None, 1) else
                     f"the longest event rounded up to pad_to_multiple_of={counted}")
    if (padded or 1) == (counted or 1):
        return []
    if (counted or 1) % (padded or 1) == 0:
        fix = ("without pad_to_multiple_of" if padded in (None, 1)
               else f"with pad_to_multiple_of={padded}")
        return [f"the loader's max_tokens={budget} counts {counted_width}, while the grids "
                f"are padded to {'it' if padded in (None, 1) else f'a multiple of {padded}'}: "
                f"batches of fewer events than fit, more steps; make the loader {fix}"]
    return [f"pad_to_multiple_of={padded} rounds each grid's length up past {counted_width}, "
            f"which max_tokens={budget} counted: grids over the budget; make the loader with "
            f"pad_to_multiple_of={padded}"]


class SequenceLoader(MappedLoader):
    """``loader``'s batches as :func:`shardify.transforms.pulse_sequences` grids of at most
    ``length`` pulses an event, made with ``pulse_sequences_arguments`` (``keep``,
    ``standardize``, ``seed``, ``padding``, ``pad_to_multiple_of``; ``epoch`` is the
    loader's, so ``keep="random"`` draws anew each epoch).

    ``length`` defaults to the loader's ``group_by_length`` cap, ``padding`` to
    ``"longest"`` when the loader groups by length (each batch padded to its longest event),
    else to ``"length"`` (one shape), and ``pad_to_multiple_of`` to the loader's. Under a
    token budget (``Loader(max_tokens=T, group_by_length=L)``) every grid then holds at
    most T cells; it warns of the settings that would overrun the budget (a longer
    ``length`` than the grouping's cap, a budget of fewer cells than ``length``, where an
    event longer than the budget forms a batch alone, ``padding="length"``, a
    ``pad_to_multiple_of`` the budget did not count, a pulse budget) or fill less of it (a
    shorter ``length``, an uncapped grouping, a budget of DOM rows, rounding less than the
    budget counted); and, without a budget, of a grouping by fewer pulses than ``length``
    (more padding).

    Length, epochs, :meth:`set_epoch`, :meth:`state_dict` and :meth:`load_state_dict` are
    the loader's (a :class:`shardify.MappedLoader`): what PyTorch Lightning takes as a
    dataloader, as :class:`shardify.torch_geometric.GraphLoader`.
    """

    def __init__(self, loader: Loader, length: int | None = None,
                 **pulse_sequences_arguments: Any):
        arguments = getattr(loader, "_arguments", {})
        grouped = _length_grouping(arguments.get("group_by_length", False))[0]
        if length is None:
            length = _pulse_cap(arguments)
            if length is None:
                raise ValueError("SequenceLoader needs a length (the pulses each event keeps): "
                                 "give it, or make the loader with group_by_length=LENGTH")
        pulse_sequences_arguments.setdefault("padding", "longest" if grouped else "length")
        counted = arguments.get("pad_to_multiple_of")
        if counted is not None and pulse_sequences_arguments["padding"] == "longest":
            pulse_sequences_arguments.setdefault("pad_to_multiple_of", counted)
        require_transform_arguments("SequenceLoader", pulse_sequences,
                                    pulse_sequences_arguments, length)
        require_sequence_arguments(length, **pulse_sequences_arguments)
        require_packed_torch("SequenceLoader", loader, PACKED_SECTIONS)
        for mismatch in _budget_mismatches(arguments, length, pulse_sequences_arguments):
            warnings.warn(f"SequenceLoader: {mismatch}", UserWarning, stacklevel=2)
        self.length = length
        self.pulse_sequences_arguments = pulse_sequences_arguments
        super().__init__(loader, self._sequences)

    def _sequences(self, batch: dict[str, Any], epoch: int) -> Any:
        return pulse_sequences(batch, self.length, epoch=epoch, **self.pulse_sequences_arguments)

    def __repr__(self) -> str:
        arguments = "".join(f", {k}={v!r}" for k, v in self.pulse_sequences_arguments.items())
        return f"shardify.sequences.SequenceLoader({self.loader!r}, {self.length}{arguments})"
