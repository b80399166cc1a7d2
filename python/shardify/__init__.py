"""shardify: pre-shuffled, DOM-packed IceCube shards and a zero-copy streaming loader.

>>> import shardify
>>> loader = shardify.Loader("dataset/", batch_events=256)   # doctest: +SKIP
>>> for batch in loader:                                     # doctest: +SKIP
...     batch["pulse_time"], batch["event_dom_offsets"]      # torch tensors, no copy

Datasets are written by the ``shardify convert`` command (installed with this package).
"""

from ._dataset import Dataset, copy_dataset
from ._loader import Loader
from ._mapped import MappedLoader
from ._native import DatasetError, __version__

__all__ = ["Dataset", "DatasetError", "Loader", "MappedLoader", "__version__", "copy_dataset"]
