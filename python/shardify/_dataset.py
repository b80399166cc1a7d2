"""``shardify.Dataset``: a dataset directory written by ``shardify convert``."""

from __future__ import annotations

import json
import os
from functools import cached_property

import numpy as np

from . import _native


class Dataset:
    """An opened dataset directory.

    ``checksums`` is when shard checksums are verified: ``"full"`` (every shard now),
    ``"lazy"`` (each shard when first read; the default) or ``"off"``. A damaged dataset
    raises :class:`shardify.DatasetError`, a missing one :class:`FileNotFoundError`.
    """

    def __init__(self, path: str | os.PathLike, checksums: str = "lazy"):
        self._native = _native.Dataset(os.fspath(path), checksums)

    @property
    def events(self) -> int:
        """Events in the dataset."""
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
    def manifest(self) -> dict:
        """The parsed manifest: format, seed, schema, totals, shards, sources."""
        return json.loads(self._native.manifest_json())

    @cached_property
    def geometry(self) -> np.ndarray:
        """The sensor table, ``[sensors, 3]`` (x, y, z in metres; row = sensor id; NaN rows
        for ids the geometry file does not list), in its stored dtype. Read-only."""
        data, dtype = self._native.sensor_positions()
        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(-1, 3)

    def event_ids(self) -> np.ndarray:
        """Every event id, int64, in stored order (the shards concatenated): what predictions
        join back to the source on. Reads every shard's ``event_id`` column."""
        return np.from_dlpack(self._native.event_ids())

    def __len__(self) -> int:
        return self._native.events

    def __repr__(self) -> str:
        return repr(self._native)
