"""``shardify.Dataset``: a dataset directory written by ``shardify convert``."""

from __future__ import annotations

import json
import os
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from . import _native

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


# How a Dataset is made again where it is unpickled: ("open", absolute path, checksums), or
# ("split", the recipe of the dataset split, fraction, seed, 0 for the rest or 1 for the
# chosen part).
_Recipe = tuple[Any, ...]

#: A directory as Python's file functions take it (bytes are decoded as ``os.fsdecode`` does).
PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes]


def _count(name: str, value: Any) -> int:
    """A non-negative integer argument below 2**64 (what the Rust side holds), or a
    ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"invalid {name}: expected a non-negative integer, not {value!r}")
    if value >> 64:
        raise ValueError(f"invalid {name}: {value} does not fit 64 bits")
    return value


class Dataset:
    """An opened dataset directory.

    ``checksums`` is when shard checksums are verified: ``"full"`` (every shard now),
    ``"lazy"`` (each shard when first read; the default) or ``"off"``. A damaged dataset
    raises :class:`shardify.DatasetError`, a missing one :class:`FileNotFoundError`.

    A Dataset pickles (for ``multiprocessing``'s spawn, ``torch.multiprocessing.spawn``,
    Ray): unpickled, it opens the same directory again (and makes a split again), and
    raises :class:`shardify.DatasetError` if the events found there are no longer the ones
    it held (:attr:`identity`).
    """

    def __init__(self, path: PathArg, checksums: str = "lazy"):
        path = os.fsdecode(path)
        self._native = _native.Dataset(path, checksums)
        self._recipe: _Recipe = ("open", os.path.abspath(path), checksums)

    @classmethod
    def _of(cls, native: _native.Dataset, recipe: _Recipe) -> Dataset:
        """A Dataset over a native dataset or split, made again elsewhere by ``recipe``."""
        view = cls.__new__(cls)
        view._native = native
        view._recipe = recipe
        return view

    @staticmethod
    def _made(recipe: _Recipe) -> Dataset:
        """The Dataset ``recipe`` describes, opened (and split) now."""
        if recipe[0] == "open":
            return Dataset(recipe[1], recipe[2])
        _, parent, fraction, seed, side = recipe
        parts: tuple[Dataset, Dataset] = Dataset._made(parent).split(fraction, seed)
        return parts[side]

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpickled_dataset, (self._recipe, self.identity)

    def split(self, fraction: float, seed: int = 0) -> tuple[Dataset, Dataset]:
        """Two disjoint views that together hold every event: ``(rest, chosen)``, where
        ``chosen`` holds ``round(fraction * len(self))`` events, those with the smallest
        ``xxh3_64(event_id)`` under ``seed`` (ties by event id). Only the event ids decide, so
        a split is the same whatever seed or shard size the dataset was converted with, and
        needs no new conversion::

            train, val = shardify.Dataset("dataset/").split(0.01, seed=0)

        A view goes wherever a Dataset does (``Loader``, resident mode, ``len``, the
        counts); ``manifest`` stays its dataset's. Making it reads every event's id and
        offsets (the shards opened, and checksummed under the dataset's policy); the two
        views hold 0.14 bytes per event between them for ``split(0.01)`` (the larger part
        lists the events it leaves out, up to a split of about 3%), 0.30-0.43 for any
        larger fraction (a part keeping more than a 16th of a shard marks its events a bit
        each)."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise ValueError(f"invalid fraction: expected a number from 0 to 1, not {fraction!r}")
        rest, chosen = self._native.split(float(fraction), _count("seed", seed))
        return (Dataset._of(rest, ("split", self._recipe, float(fraction), seed, 0)),
                Dataset._of(chosen, ("split", self._recipe, float(fraction), seed, 1)))

    @property
    def identity(self) -> str:
        """Which events this holds, as 16 hex digits: the same for a copy of the dataset at
        any path or in either layout, another for another conversion, source, shard size or
        split. What a loader's ``state_dict()["dataset"]`` records."""
        return self._native.identity

    @property
    def whole(self) -> bool:
        """Whether this holds every event of the dataset (False for a split)."""
        return self._native.whole

    @property
    def events(self) -> int:
        """Events in the dataset (or the split)."""
        return self._native.events

    @property
    def doms(self) -> int:
        """DOMs (hit sensors, summed over events)."""
        return self._native.doms

    @property
    def pulses(self) -> int:
        """Pulses."""
        return self._native.pulses

    @property
    def labels(self) -> bool:
        """Whether events carry azimuth and zenith (train split: yes; test split: no)."""
        return self._native.labels

    @property
    def path(self) -> str:
        """The dataset directory."""
        return os.fspath(self._native.path)

    @cached_property
    def manifest(self) -> dict[str, Any]:
        """The parsed manifest: format, seed, schema, totals, shards, sources (of the whole
        dataset, for a split too)."""
        manifest: dict[str, Any] = json.loads(self._native.manifest_json())
        return manifest

    @cached_property
    def geometry(self) -> npt.NDArray[np.floating[Any]]:
        """The sensor table, ``[sensors, 3]`` (x, y, z in metres; row = sensor id; NaN rows
        for ids the geometry file does not list), in its stored dtype. Read-only."""
        data, dtype = self._native.sensor_positions()
        import numpy as np

        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(-1, 3)

    def event_ids(self) -> npt.NDArray[np.int64]:
        """Every event id, int64, in stored order (the shards concatenated): what predictions
        join back to the source on. Reads every shard's ``event_id`` column."""
        import numpy as np

        return cast("npt.NDArray[np.int64]", np.from_dlpack(self._native.event_ids()))

    def __getitem__(self, index: Any) -> Any:
        """Refused, saying why: torch's ``DataLoader`` given a dataset of this name takes it
        for a map-style ``torch.utils.data.Dataset`` (it has a length) and asks for
        ``dataset[i]``, one event at a time."""
        raise TypeError(
            "a shardify.Dataset is not indexed event by event: its batches come from "
            "shardify.Loader(dataset, batch_events=...), which shuffles, gathers and "
            "batches them with threads of its own (a torch DataLoader is not needed); "
            "`shardify dump` prints events")

    def __len__(self) -> int:
        return self._native.events

    def __repr__(self) -> str:
        return repr(self._native)


def copy_dataset(
    source: PathArg,
    destination: PathArg,
    layout: str | None = None,
    check: bool = False,
) -> dict[str, Any]:
    """Copies the dataset in ``source`` to ``destination`` (a new or empty directory, or
    one this copy was made or stopped in), such as a node's local disk before training:
    what ``shardify copy`` does.

    ``layout="records"`` writes the copy's shards with each event's pieces side by side,
    which a loader reading events at random (windows of 4 blocks and more) gathers faster,
    and windows of 1 block slower (docs/format.md, "The records layout");
    ``layout="columns"`` writes them as ``convert`` does, whole columns any safetensors
    reader sees as arrays. By default the copy keeps the source's layout.

    Every file the manifest lists is checked against its size and checksum on the way
    (a damaged one raises :class:`shardify.DatasetError` and a fresh copy leaves nothing
    behind; an :class:`OSError`, a failed read or a full disk, leaves a stopped copy that
    the same call finishes once the cause is gone), the
    manifest is written last, and the copy is cached in huge pages where the filesystem
    supports them, which ``cp`` loses (the loader ran 9-15% faster at window 64 from such a
    copy than from ``cp``'s: docs/results.md, "Copies in huge pages").

    Running the same copy again is cheap and safe, so every rank of a node may call it,
    and a requeued job may call it again: a copy into the same destination under way in
    another process is waited for; a destination that holds this copy finished is kept
    as it is (``"outcome": "present"``); a copy stopped partway (a killed process, a
    preempted job) is finished, keeping the files it copied whose sizes and checksums
    match (``"resumed"``). A destination that holds anything else raises
    :class:`FileExistsError` and is left as it was. A finished copy is recognised by its
    files' sizes; ``check=True`` reads every file and compares it with the manifest's
    checksum instead, copying again the ones that differ or are missing (``"repaired"``):
    the way out of a :class:`shardify.DatasetError` checksum mismatch in a copy. Returns
    ``{"shards", "bytes", "written", "outcome", "kept", "seconds"}``: the dataset's shards
    and bytes, the bytes this call wrote, ``"copied"``, ``"resumed"``, ``"present"`` or
    ``"repaired"``, the files left as they were found::

        shardify.copy_dataset("/project/icecube/ds", "/tmp/ds")  # on every rank
    """
    shards, nbytes, written, outcome, kept, seconds = _native.copy_dataset(
        os.fsdecode(source), os.fsdecode(destination), layout, check
    )
    return {"shards": shards, "bytes": nbytes, "written": written, "outcome": outcome,
            "kept": kept, "seconds": seconds}


def _unpickled_dataset(recipe: _Recipe, identity: str) -> Dataset:
    """A pickled Dataset made again: the same directory (and split), refused if it no longer
    holds the events it held when pickled."""
    dataset = Dataset._made(recipe)
    if dataset.identity != identity:
        raise _native.DatasetError(
            f"{dataset.path}: the dataset changed since this Dataset was pickled (identity "
            f"{identity} then, {dataset.identity} now): converted or copied again into the "
            "same directory?")
    return dataset
