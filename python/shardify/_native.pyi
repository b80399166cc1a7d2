"""Types of the compiled module (``python/src``, pyo3): what ``shardify``'s Python layer
wraps. Users reach it through :class:`shardify.Dataset` and :class:`shardify.Loader`."""

from collections.abc import Callable
from os import PathLike
from typing import Any, final

__all__ = [
    "__version__",
    "DatasetError",
    "ONE_THREAD_AT_A_TIME",
    "Dataset",
    "Loader",
    "Section",
    "HostArray",
    "run_cli",
    "copy_dataset",
    "machine",
]

__version__: str

#: The ``RuntimeError`` of a loader used from a second thread while one is inside it.
ONE_THREAD_AT_A_TIME: str

class DatasetError(Exception):
    """A dataset that cannot be read as written: a damaged or truncated shard, a checksum
    mismatch, a manifest that does not match its files, another format version."""

@final
class HostArray:
    """An owned host array exported through DLPack (``np.from_dlpack``, ``torch.from_dlpack``)."""

    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str: ...
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

@final
class Section:
    """One section of a delivered batch, viewing its staging (or device) buffer."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str: ...
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

@final
class Dataset:
    """An opened dataset directory, or a split of one."""

    def __new__(cls, path: str | PathLike[str], checksums: str = "lazy") -> Dataset: ...
    def __len__(self) -> int: ...
    @property
    def events(self) -> int: ...
    @property
    def doms(self) -> int: ...
    @property
    def pulses(self) -> int: ...
    @property
    def shards(self) -> int: ...
    @property
    def labels(self) -> bool: ...
    @property
    def path(self) -> str: ...
    @property
    def whole(self) -> bool: ...
    @property
    def identity(self) -> str: ...
    def split(self, fraction: float, seed: int) -> tuple[Dataset, Dataset]: ...
    def shard_counts(self) -> list[tuple[int, int, int]]: ...
    def manifest_json(self) -> str: ...
    def sensor_positions(self) -> tuple[bytes, str]: ...
    def event_ids(self) -> HostArray: ...
    def shard_tensors(self, shard: int) -> list[tuple[str, HostArray]]: ...

@final
class Loader:
    """The Rust streaming loader (see :class:`shardify.Loader` for the arguments)."""

    def __new__(
        cls,
        dataset: Dataset,
        *,
        batch_events: int,
        max_pulses: int | None,
        max_tokens: int | None,
        max_events: int | None,
        pulse_cap: int | None,
        pad_to_multiple_of: int | None,
        layout: str,
        max_doms: int | None,
        pulses_per_dom: int | None,
        seed: int,
        block_events: int,
        window_blocks: int,
        run_events: int,
        batch_order: str,
        shuffle: bool,
        group_by_length: bool,
        length_cap: int | None,
        length_of: str,
        drop_last: bool,
        rank: int,
        world: int,
        workers: int,
        worker_scheduling: str,
        consumer_gathers: bool,
        prefetch: int | None,
        device: str,
        dom_positions: bool,
    ) -> Loader: ...
    def next_batch(self) -> list[Section] | None: ...
    def next_batch_capsules(self, stream: Any | None = None) -> list[Any] | None: ...
    def next_batch_dict(
        self,
        convert: Callable[[Any], Any],
        stream: Any | None = None,
        tensor_type: type | None = None,
    ) -> dict[str, Any] | None: ...
    def drain(self) -> tuple[int, int, int, float]: ...
    def position(self) -> tuple[int, int, int]: ...
    def seek(self, epoch: int, origin: int, batches_taken: int) -> None: ...
    def batch_count(self, epoch: int, origin: int) -> int: ...
    def settings_json(self) -> str: ...
    def check_resumable(self, settings_json: str) -> None: ...
    def dataset_identity(self) -> str: ...
    def check_dataset(self, saved: str) -> None: ...
    def staging_allocations(self) -> int: ...
    def placement(self) -> tuple[str, str]: ...
    def sections(self) -> list[tuple[str, str]]: ...
    def epoch_plan(
        self, epoch: int, origin: int, batches_taken: int
    ) -> tuple[HostArray, HostArray, HostArray, HostArray, HostArray]: ...

def run_cli(argv: list[str]) -> int: ...
def machine(device: str) -> tuple[str, str]: ...
def copy_dataset(
    source: str | PathLike[str],
    destination: str | PathLike[str],
    layout: str | None = None,
    check: bool = False,
) -> tuple[int, int, int, str, int, float]: ...
