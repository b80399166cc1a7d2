"""``shardify.Loader``: shuffled, DOM-packed batches as zero-copy torch tensors."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import _native
from ._dataset import Dataset, PathArg, _count
from ._iterators import SUPERSEDED, not_indexed
from ._mapped import BatchFunction, MappedLoader

if TYPE_CHECKING:
    from ._resident import ResidentBatches

def _length_grouping(value: Any) -> tuple[bool, int | None]:
    """``group_by_length`` as the native loader takes it: whether, and the cap (a
    ``ValueError`` unless False, True or a positive integer)."""
    if isinstance(value, bool):
        return value, None
    if isinstance(value, int) and value >= 1:
        return True, _count("group_by_length", value)
    raise ValueError(f"invalid group_by_length: expected False, True or a positive pulse "
                     f"count (the length events are cut to), not {value!r}")


def _optional_count(name: str, value: Any) -> int | None:
    """None, or a non-negative integer argument (else a ValueError naming it)."""
    return None if value is None else _count(name, value)


def _rank_world(rank: int | None, world: int | None) -> tuple[int, int]:
    """The arguments, else ``torch.distributed`` when initialised, else the ``RANK`` and
    ``WORLD_SIZE`` environment variables, else rank 0 of 1."""
    if (rank is None) != (world is None):
        raise ValueError("invalid rank: give both rank and world, or neither")
    if rank is not None:
        return rank, world  # type: ignore[return-value]
    # Only a job that imported torch can have initialised torch.distributed.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env_rank, env_world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if env_rank is not None and env_world is not None:
        try:
            return int(env_rank), int(env_world)
        except ValueError:
            raise ValueError(
                f"invalid rank: RANK={env_rank!r} and WORLD_SIZE={env_world!r} are not integers"
            ) from None
    return 0, 1


def _device_name(device: Any, output: str) -> str:
    """``"auto" | "cpu" | "cuda" | "cuda:N"``, or a ``torch.device``, as the loader's name.
    For torch output, ``auto`` (when torch sees a GPU) and ``cuda`` without an index mean
    torch's current CUDA device, as ``"cuda"`` does in torch: the device a DDP rank chose
    with ``torch.cuda.set_device(local_rank)``, not every rank's device 0."""
    name: str
    if isinstance(device, str):
        name = device
    else:
        kind, index = getattr(device, "type", None), getattr(device, "index", None)
        if kind == "cpu":
            return "cpu"
        if kind != "cuda":
            raise ValueError(
                f"invalid device: {device!r} (expected auto, cpu, cuda, cuda:N or a "
                "torch.device)")
        name = "cuda" if index is None else f"cuda:{index}"
    if name in ("auto", "cuda") and output == "torch":
        current = _torch_current_cuda()
        if current is not None:
            return f"cuda:{current}"
    return name


#: The oldest torch a loader delivers to: torch 2.1's DLPack import has no boolean type,
#: which a batch's ``pulse_auxiliary`` is ("RuntimeError: Unsupported code 6").
OLDEST_TORCH = (2, 2)


def _require_torch() -> None:
    """Imports torch, which torch output and resident loaders need; where it is not
    installed, or older than :data:`OLDEST_TORCH`, an error that says so and what works
    without it."""
    try:
        import torch
    except ModuleNotFoundError as missing:
        if missing.name != "torch":
            raise
        raise ModuleNotFoundError(
            'shardify.Loader delivers torch tensors (output="torch", the default, and '
            'resident=True), and PyTorch is not installed here: pip install torch, or pass '
            'output="numpy" for numpy arrays', name="torch") from missing
    release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if release < OLDEST_TORCH:
        raise ImportError(
            f"shardify.Loader delivers torch tensors to torch "
            f"{'.'.join(map(str, OLDEST_TORCH))} or newer (older DLPack imports have no "
            f"boolean type); this is torch {torch.__version__}: upgrade it, or pass "
            'output="numpy" for numpy arrays', name="torch")


def _torch_current_cuda() -> int | None:
    """torch's current CUDA device, or None when torch sees none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.current_device()


class Loader:
    """Streams a dataset's shuffled batches for this rank, one epoch per ``for`` loop.

    >>> loader = shardify.Loader("dataset/", batch_events=256)   # doctest: +SKIP
    >>> for epoch in range(10):                                  # doctest: +SKIP
    ...     for batch in loader:                                 # the next epoch each time
    ...         batch["pulse_time"], batch["event_dom_offsets"]

    Arguments (all but the first keyword-only):

    * ``dataset_or_path``: a :class:`shardify.Dataset` (or a split of one) or the path of a
      directory written by ``shardify convert``.
    * ``batch_events`` (256): events per batch. Bigger batches cost more staging memory
      (about 2 kB per event with the real statistics, times ``workers`` + ``prefetch``).
    * ``max_pulses`` (None): batch by a pulse budget instead: each batch holds as many
      events as fit in ``max_pulses`` pulses (an event larger than the budget forms a batch
      of its own); ``max_events`` (None) caps the events of such a batch. With
      ``pulse_cap`` (None), each event counts at most that many of its pulses: the nodes of
      a GNN that cuts events to ``pulse_cap`` pulses (``to_pyg(max_pulses=pulse_cap)``), so
      the budget bounds what it computes on. Uncapped, with the real statistics cut to 256
      a budget held 52-58% of its nodes and one batch in 13 was a single long event.
    * ``max_tokens`` (None): with ``group_by_length``, batch by a budget of padded tokens
      instead, as fairseq's ``max_tokens`` does: each batch holds as many events as fit in a
      grid of ``max_tokens`` (events times the batch's longest length, counted and capped
      as ``group_by_length`` and ``length_of`` count it), so a model that pads each batch
      to its longest event gets grids of nearly equal size and memory: short events in big
      batches, long ones in small. Each window is cut on its own; ``max_events`` caps the
      events of a batch (the shortest events otherwise come in batches of thousands). An
      event longer than ``max_tokens`` forms a batch alone, over the budget: keep the
      budget at least the ``group_by_length`` cap. ``pad_to_multiple_of`` (None): the
      longest length counted rounded up to a multiple of it (at most the cap), for a model
      that pads its grids so (tensor cores, fewer shapes to compile):
      ``shardify.sequences.SequenceLoader`` pads them so by default.
    * ``layout`` ("packed"): ``"packed"`` (the two-level CSR below) or ``"padded"``, which
      needs ``max_doms`` (M, DOMs kept per event, earliest first) and ``pulses_per_dom``
      (K, pulses kept per DOM) and costs ``B x M x (4 + 3K)`` float32 per batch.
    * ``seed`` (0): the shuffle's seed; with the epoch it fixes every batch.
    * ``block_events`` (256), ``window_blocks`` (16), ``run_events`` (1): the block shuffle.
      The stored order is rotated and cut into blocks of ``block_events`` consecutive events,
      the blocks permuted, ``window_blocks`` blocks open at a time and their events shuffled
      in runs of ``run_events``. Wider windows mix better and read less sequentially
      (a window of every block, ``window_blocks >= ceil(len(dataset) / block_events)``,
      is a complete shuffle).
    * ``batch_order`` ("stored"): the events inside a batch in stored order (faster copies)
      or ``"drawn"`` (the order the shuffle drew them).
    * ``shuffle`` (True): False delivers the stored order every epoch (evaluation,
      inference): every event of this rank's share once, the last partial batch kept.
    * ``group_by_length`` (False): True or a length ``L``: the batches inside each window
      hold events of similar length (lengths above ``L`` counting as ``L``: give the length
      a model cuts events to), in a random order of lengths, as the Kaggle competition's
      top transformers were batched and as Hugging Face's ``group_by_length`` does.
      ``length_of`` ("pulses"): what a length counts, pulses (sequence models) or
      ``"doms"`` (DOM-level models, and the padded layout, whose grid is as wide as a
      batch's most DOMs: give ``max_doms`` as ``L``). A batch padded to its longest event
      then holds little padding: with the real statistics cut to 256 pulses, 30% of such a
      grid is pulses drawn at random, 91% grouped in windows of 16 batches (wider windows
      group tighter). The events of a window are the same, each batch is one length class
      of them; with ``batch_events`` or ``max_tokens`` (not ``max_pulses``). Without
      shuffle, each window's batches come shortest first.
    * ``drop_last`` (None): drop the last partial batch. None means True when ``world > 1``
      and shuffling, so every rank gets as many batches (DDP needs it), else False. With
      ``max_tokens`` no batch counts as partial: it only evens the ranks' batch counts.
    * ``rank``, ``world`` (None): this process's share; None takes them from
      ``torch.distributed`` when initialised, else ``RANK`` / ``WORLD_SIZE``, else 0 / 1.
    * ``workers`` (2): threads gathering batches (each one a core while it works).
    * ``worker_scheduling`` ("batch"): ``"batch"`` puts the gathering threads under
      Linux's ``SCHED_BATCH`` (same CPU share; a worker that wakes does not preempt the
      training loop's thread, which with no core to spare saves it a context switch per
      batch); ``"normal"`` leaves them under the process's policy.
    * ``consumer_gathers`` (True): the thread that waits for the next batch (the one
      iterating, or on a GPU the loader's copy thread) gathers a batch itself while it
      would wait, instead of sleeping until a worker sends one; the batches are the same.
      With as many workers as cores this keeps a core from idling while threads wake.
    * ``prefetch`` (None): batches gathered ahead, each in a staging buffer of its own.
      None means twice the workers that can run at once (``workers``, at most the cores
      this process may use), at least 4, as PyTorch keeps ``prefetch_factor=2`` per
      worker: batches come in order while workers finish out of order, and with 8
      workers on a 16-core GPU machine 4 batches ahead left the loop waiting for data.
      Workers and prefetched batches whose buffers need more than the machine's (or the
      job's cgroup's) memory raise ``ValueError`` here, before anything is allocated.
    * ``device`` ("auto"): ``"auto"`` (torch's current CUDA device when torch sees one,
      else the CPU), ``"cpu"``, ``"cuda"`` (torch's current device), ``"cuda:N"`` or a
      ``torch.device``. On a GPU batches are copied
      asynchronously from pinned staging buffers onto the device, ordered before torch's
      current stream.
    * ``output`` ("torch"): ``"torch"`` tensors or ``"numpy"`` arrays (host only; torch is
      then never imported).
    * ``dom_positions`` (True): include ``dom_position`` (12 or 24 bytes per DOM); False
      for models that embed sensor ids or look positions up themselves.
    * ``resident`` (False): hold the whole dataset on ``device`` (a GPU, or ``"cpu"``) as
      concatenated columns and gather each batch there, in the order the same Rust sampler
      plans (the streaming loader's batches, section for section); ``workers`` and
      ``prefetch`` then do nothing, ``output`` must be ``"torch"``. The dataset is read
      onto the device at the first batch (so a loader made before DDP set its rank's GPU
      loads it there, once); one that does not fit raises ``MemoryError`` then, before
      anything is allocated (about 1.8 GB per million events with the real statistics).

    Sections of a packed batch (B events, D DOMs, P pulses):

    * ``event_id`` ``[B]`` int64; ``event_azimuth``, ``event_zenith`` ``[B]`` float64 when
      the dataset has labels;
    * ``event_dom_offsets`` ``[B+1]`` int32 and ``dom_pulse_offsets`` ``[D+1]`` int32: CSR
      offsets rebased to the batch (event b's DOMs are rows
      ``event_dom_offsets[b]:event_dom_offsets[b+1]``);
    * ``dom_sensor_id`` ``[D]`` (the stored integer dtype), ``dom_position`` ``[D, 3]``
      (the sensor table's float dtype, metres);
    * ``pulse_time``, ``pulse_charge`` ``[P]`` (the stored dtypes), ``pulse_auxiliary``
      ``[P]`` bool; within a DOM in time order, DOMs by first hit.

    Padded layout: ``event_id``, the labels, ``dom_features`` ``[B, M', 4 + 3K]`` float32
    (x, y, z, pulse count, then time, charge, auxiliary of the DOM's first K pulses;
    ``M'`` is the batch's largest DOM count capped at ``max_doms``) and ``dom_mask``
    ``[B, M']`` uint8.

    Each tensor views the loader's staging buffer (no copy); the buffer is reused only
    when the last tensor over it is freed. ``len(loader)`` is this rank's batches per
    epoch; ``state_dict()`` / ``load_state_dict()`` checkpoint and resume mid-epoch, at any
    world size (the global position is recorded). Errors: ``ValueError`` naming the
    argument, :class:`shardify.DatasetError` naming the shard.

    A loader pickles (``multiprocessing``'s spawn, ``torch.multiprocessing.spawn``, Ray):
    unpickled, it is made again with the same arguments on the same dataset (rank, world
    and device resolved where and when it is unpickled, when they were left to be found:
    a rank of ``torch.multiprocessing.spawn`` unpickles before its process group exists,
    so make the loader there, or pass ``rank`` and ``world``) and resumed at its position
    (``state_dict``); batches held elsewhere stay where they are.
    """

    def __init__(
        self,
        dataset_or_path: Dataset | PathArg,
        *,
        batch_events: int = 256,
        max_pulses: int | None = None,
        max_tokens: int | None = None,
        max_events: int | None = None,
        pulse_cap: int | None = None,
        pad_to_multiple_of: int | None = None,
        layout: str = "packed",
        max_doms: int | None = None,
        pulses_per_dom: int | None = None,
        seed: int = 0,
        block_events: int = 256,
        window_blocks: int = 16,
        run_events: int = 1,
        batch_order: str = "stored",
        shuffle: bool = True,
        group_by_length: bool | int = False,
        length_of: str = "pulses",
        drop_last: bool | None = None,
        rank: int | None = None,
        world: int | None = None,
        workers: int = 2,
        worker_scheduling: str = "batch",
        consumer_gathers: bool = True,
        prefetch: int | None = None,
        device: Any = "auto",
        output: str = "torch",
        dom_positions: bool = True,
        resident: bool = False,
    ):
        # What a pickled loader is made again with: the arguments as given (rank, world and
        # device left to be found are found again by the process that unpickles it).
        self._arguments: dict[str, Any] = {
            name: value for name, value in locals().items()
            if name not in ("self", "dataset_or_path")}
        if isinstance(dataset_or_path, Dataset):
            dataset = dataset_or_path
        else:
            dataset = Dataset(dataset_or_path)
        if output == "torch":  # resident loaders too: they deliver torch tensors
            _require_torch()
        # What was found for rank, world and device left to be found, to tell when the
        # process changed (see _follow_the_process).
        self._found = (*_rank_world(rank, world), _device_name(device, output))
        if output not in ("torch", "numpy"):
            raise ValueError(f'invalid output: {output!r} (expected "torch" or "numpy")')
        rank, world, device = self._found
        _count("rank", rank)
        if _count("world", world) == 0:
            raise ValueError("invalid world: must be at least 1")
        if rank >= world:
            raise ValueError(f"invalid rank: rank {rank} of world {world}")
        if drop_last is None:
            drop_last = world > 1 and bool(shuffle)
        if output == "numpy":
            if resident:
                raise ValueError(
                    'invalid output: resident=True delivers torch tensors on the device that '
                    'holds the dataset; use output="torch" (the default)')
            if device.startswith("cuda"):
                raise ValueError("invalid device: numpy output lives in host memory; use cpu")
            device = "cpu"
        self.dataset = dataset
        self.output = output
        self.rank, self.world, self.drop_last = rank, world, bool(drop_last)
        workers, prefetch = _count("workers", workers), _optional_count("prefetch", prefetch)
        grouped, length_cap = _length_grouping(group_by_length)
        self._native = _native.Loader(
            dataset._native,
            batch_events=_count("batch_events", batch_events),
            max_pulses=_optional_count("max_pulses", max_pulses),
            max_tokens=_optional_count("max_tokens", max_tokens),
            max_events=_optional_count("max_events", max_events),
            pulse_cap=_optional_count("pulse_cap", pulse_cap),
            pad_to_multiple_of=_optional_count("pad_to_multiple_of", pad_to_multiple_of),
            layout=layout,
            max_doms=_optional_count("max_doms", max_doms),
            pulses_per_dom=_optional_count("pulses_per_dom", pulses_per_dom),
            seed=_count("seed", seed),
            block_events=_count("block_events", block_events),
            window_blocks=_count("window_blocks", window_blocks),
            run_events=_count("run_events", run_events),
            batch_order=batch_order,
            shuffle=bool(shuffle),
            group_by_length=grouped,
            length_cap=length_cap,
            length_of=length_of,
            drop_last=self.drop_last,
            rank=rank,
            world=world,
            # A resident loader only plans with it: it gathers nothing (no staging buffers
            # to hold; 0 is still refused), and its device is torch's (below).
            workers=min(workers, 1) if resident else workers,
            worker_scheduling=worker_scheduling,
            consumer_gathers=bool(consumer_gathers),
            prefetch=(1 if prefetch is None else min(prefetch, 1)) if resident else prefetch,
            device="cpu" if resident else device,
            dom_positions=bool(dom_positions),
        )
        self.section_names: tuple[str, ...] = tuple(name for name, _ in self._native.sections())
        self.resident = bool(resident)
        self._batches: _Streaming | ResidentBatches
        if self.resident:
            from ._resident import ResidentBatches, layout_of

            self.device, self.placement_reason = _resident_device(device)
            self._batches = ResidentBatches(
                self._native, dataset, self.device, layout_of(self._native, max_doms,
                                                              pulses_per_dom))
        else:
            placement, self.placement_reason = self._native.placement()
            if output == "torch":
                import torch

                self.device = torch.device(placement)
                self._batches = _TorchBatches(self._native, self.section_names, self.device)
            else:
                self.device = placement
                self._batches = _Streaming(self._native, self.section_names)
        self.shuffle = bool(shuffle)
        self._lengths: dict[tuple[int, int], int] = {}
        # The epoch and count len() first answered (what a trainer that reads it once
        # keeps), and whether an epoch left short at a kept count was warned of.
        self._first_length: tuple[int, int] | None = None
        # The epoch and origin of the last state loaded (a restart at the epoch's end
        # when nothing of it was left).
        self._resumed: tuple[int, int] | None = None
        self._warned_of_a_short_epoch = False
        # The position load_state_dict set, while no batch has been handed out since.
        self._loaded: tuple[int, int, int] | None = None
        self._sampler: Any = None
        self._made = True  # the last field: __repr__ shows a loader only once it is made

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One epoch, from where the loader stands: the start of the next epoch after a
        finished one (its last batch handed out, whether or not the ``for`` over it asked
        for the end: PyTorch Lightning stops after ``len(loader)`` batches), the rest of the
        epoch after a ``break`` or ``load_state_dict``.

        A loader is one stream of batches: a newer ``iter(loader)`` takes it over, and an
        older iterator still held raises ``RuntimeError`` at its next batch, where it would
        have taken the newer one's batches (or, after its epoch, the next epoch's); so does
        one whose loader was made again for a process's new rank, world or device. For two
        independent streams, make two loaders."""
        self._follow_the_process()
        epoch, origin, taken = self._batches.position()
        if self._handed_out_every_batch(epoch, origin, taken):
            self._batches.seek(epoch + 1, 0, 0)
        turn = self._turn = object()
        return self._stream(turn)

    def _stream(self, turn: object) -> Iterator[dict[str, Any]]:
        """The rest of the epoch while ``turn`` is the loader's newest. It holds the loader,
        not its batches: a loader made again drops its old native loader (its threads, its
        staging buffers, a resident copy) even while an older iterator is still held.

        Let go of before its epoch's end while still the newest (closed, or freed), it
        checks the epoch it leaves as :meth:`set_epoch` does: a trainer lets go of its
        iterator after its last epoch too (PyTorch Lightning at the end of ``fit``), after
        which nothing else asks the loader."""
        try:
            while True:
                if self._turn is not turn:
                    raise RuntimeError(SUPERSEDED)
                batch = self._batches.next()
                if batch is None:
                    return
                yield batch
        except GeneratorExit:
            if self._turn is turn:
                self._warn_if_left_short(*self._batches.position())
            raise

    def __len__(self) -> int:
        """The batches this rank gets in the epoch the next ``for`` runs, counted from the
        epoch's start, as a ``DataLoader``'s length: a loader resumed mid-epoch hands out
        the rest of them (PyTorch Lightning counts the batches a checkpoint recorded
        against it; a learning-rate schedule's steps per epoch are the same on every run).
        Exact, but after an elastic resume: counted at the new world size, while its epoch
        began at the old one."""
        self._follow_the_process()
        epoch, origin, taken = self._batches.position()
        if self._handed_out_every_batch(epoch, origin, taken):
            epoch += 1
        count = self._batch_count(epoch, 0)
        if self._first_length is None:
            self._first_length = (epoch, count)
        return count

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        epoch, origin, taken = self._batches.position()
        return epoch + self._handed_out_every_batch(epoch, origin, taken)

    def _follow_the_process(self) -> None:
        """Makes the loader again, at its position, when the rank, world or device it was
        left to find are other ones now: made before ``torch.distributed`` was initialised
        (PyTorch Lightning's DDP starts its processes' groups, and sets their CUDA devices,
        after the script made the loader it was given), it would have read the whole
        dataset on every rank, on the device that was current then. Found again when taken
        into use (``len``, ``for``), as MosaicML Streaming finds its world when iterated."""
        a = self._arguments
        if (*_rank_world(a["rank"], a["world"]), _device_name(a["device"], a["output"])) \
                == self._found:
            return
        state, loaded = self.state_dict(), self._loaded == self._batches.position()
        # The old native loader (its threads, its buffers, a resident copy) goes first; an
        # iterator over it still held would hand out batches of the old share, position
        # apart from the new one's: it raises at its next batch.
        self._native = self._batches = None  # type: ignore[assignment]
        self._turn = object()
        self._made = False
        Loader.__init__(self, self.dataset, **a)
        self.load_state_dict(state)
        if not loaded:
            self._loaded = None

    def _batch_count(self, epoch: int, origin: int) -> int:
        """This rank's batches in ``epoch`` dealt from global batch ``origin`` on (cached:
        with a pulse budget, counting them is a pass over the epoch's order)."""
        if (epoch, origin) not in self._lengths:
            self._lengths[epoch, origin] = self._native.batch_count(epoch, origin)
        return self._lengths[epoch, origin]

    def _handed_out_every_batch(self, epoch: int, origin: int, taken: int) -> bool:
        """Whether this loader handed out the last of its batches of ``epoch`` without the
        ``for`` asking for the end, which would have moved it to the next epoch. A position
        set there (``load_state_dict`` of a state saved after the last batch) is not: the
        next ``for`` runs the empty rest of that epoch first, as torchdata's
        ``StatefulDataLoader`` does, and as Lightning expects when it restarts from a
        checkpoint made at the end of an epoch."""
        return taken > 0 and taken >= self._batch_count(epoch, origin)

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` from its first batch at the next ``for``; but right after
        :meth:`load_state_dict` of a state saved in epoch ``epoch``, keeps the loaded
        position, so that the next ``for`` resumes it. So a loop that calls
        ``set_epoch(epoch)`` at the top of every epoch, as ``DistributedSampler`` asks (and
        as PyTorch Lightning does through :attr:`sampler`), resumes mid-epoch too. Leaving
        an epoch short of its batches at a count PyTorch Lightning kept from another (under
        a budget, whose epochs differ in count) warns, once, naming the cause."""
        epoch = _count("epoch", epoch)
        position = self._batches.position()
        if position == self._loaded and position[0] == epoch:
            return
        if epoch != position[0]:
            self._warn_if_left_short(*position)
        self._batches.seek(epoch, 0, 0)

    def _warn_if_left_short(self, epoch: int, origin: int, taken: int) -> None:
        """Warns (once per loader) when ``epoch`` is left short of its own count at the count
        of another epoch that PyTorch Lightning kept: under a pulse or token budget each
        epoch has its own count, and Lightning stops an epoch at the ``len()`` it read at
        its start (every epoch's, unless it reloads its dataloaders; a resumed one's, read
        before it loaded the loader's state), or, restarted at an epoch's end, at that
        epoch's count. Left at any other count (a ``break``, ``limit_train_batches``) the
        epoch is not warned of."""
        if self._warned_of_a_short_epoch or origin % self.world:
            return
        done = origin // self.world + taken  # from the epoch's start, at this world size
        first, resumed = self._first_length, self._resumed
        if resumed is not None and resumed[0] + 1 == epoch and resumed[1] > 0 \
                and self._batch_count(*resumed) == 0 and done == self._batch_count(resumed[0], 0):
            kept = (f"the count of epoch {resumed[0]}, at whose end the job restarted",
                    ", restarted from a checkpoint made at an epoch's last step, takes that "
                    "epoch's count as the next one's limit, also when it reloads its "
                    "dataloaders")
        elif first is not None and resumed is not None and resumed[0] == epoch \
                and done == max(first[1], resumed[1] // self.world):
            kept = (f"where the job resumed it (at batch {resumed[1] // self.world}) with the "
                    f"count len() gave for epoch {first[0]}, {first[1]}",
                    ", resuming mid-epoch, reads len() before it loads the loader's state and "
                    "keeps it as the resumed epoch's limit, also when it reloads its "
                    "dataloaders")
        elif first is not None and first[0] != epoch and done == first[1]:
            kept = (f"the count len() gave for epoch {first[0]}",
                    " keeps the len() it read at its start as every epoch's limit unless it "
                    "reloads its dataloaders (as would a loop that reads len() once): give "
                    "the Trainer (or GraphNeT's fit) reload_dataloaders_every_n_epochs=1")
        else:
            return
        count = self._batch_count(epoch, 0)
        if done >= count:
            return
        self._warned_of_a_short_epoch = True
        warnings.warn(
            f"Loader: epoch {epoch} was left after {done} of its {count} batches, {kept[0]}: "
            f"its last {count - done} were not trained. Under a pulse or token budget each "
            f"epoch has its own number of batches, and PyTorch Lightning{kept[1]}. "
            f"(Warned once per loader.)", stacklevel=3)

    #: None, as a ``DataLoader``'s beside its ``sampler``: what Lightning reads with it.
    batch_sampler: None = None

    @property
    def sampler(self) -> Any:
        """A torch sampler standing for this loader where frameworks look for a
        ``DataLoader``'s: its ``set_epoch`` is the loader's (PyTorch Lightning calls it at
        every epoch's start, training and evaluation alike), and without shuffle it is a
        ``SequentialSampler`` (GraphNeT's ``predict_as_dataframe`` asks for one)."""
        from ._samplers import DrawnOrderSampler, StoredOrderSampler

        if self._sampler is None:
            kind = DrawnOrderSampler if self.shuffle else StoredOrderSampler
            self._sampler = kind(self)
        return self._sampler

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands (after the last batch handed out, not the last
        prefetched): the epoch and ``global_batches``, the batches every rank of the world
        together has consumed (this rank's count times the world size, the ranks of a
        data-parallel job stepping together), the settings that decide the order, and
        ``dataset``, the identity of the events read (the same for a copy of the dataset at
        any path or in either layout, another for another conversion or split). It holds no
        rank and resumes any rank of any world size (see :meth:`load_state_dict`); ``world``
        and ``batches_taken`` (this rank's count) are there for information."""
        epoch, origin, taken = self._batches.position()
        return {
            "epoch": epoch,
            "global_batches": origin + taken * self.world,
            "batches_taken": taken,
            "world": self.world,
            "sampler": json.loads(self._native.settings_json()),
            "dataset": self._native.dataset_identity(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at a saved position, elastically: whatever world size saved it, the ranks
        of this one deal the epoch's remaining global batches among themselves from
        ``global_batches`` on (batch ``global_batches + r`` to rank ``r``, then round-robin),
        so no event of the epoch comes twice and none is skipped beyond what ``drop_last``
        drops. A ``ValueError`` names the field when the state was made with settings that
        decide another order (seed, batching, blocks, window, runs, batch order, shuffle,
        length grouping), and names ``dataset`` when it was saved reading other events
        (another conversion, source, shard size or split; a state without ``dataset``, saved
        before it was recorded, is not checked); ``world`` and ``drop_last`` may differ.
        Save rank 0's state: at the end of an epoch without ``drop_last``, other ranks may
        have had one batch fewer."""
        if not isinstance(state, dict):
            raise ValueError(f"invalid state: expected a dict, not {type(state).__name__}")
        missing = [k for k in ("epoch", "sampler") if k not in state]
        if "global_batches" not in state and "batches_taken" not in state:
            missing.append("global_batches")
        if missing:
            raise ValueError(f"invalid state: missing {', '.join(missing)}")
        saved = state["sampler"]
        if not isinstance(saved, dict):
            raise ValueError("invalid state: sampler is not a dict of settings")
        self._native.check_resumable(json.dumps(saved))
        if "dataset" in state:
            if not isinstance(state["dataset"], str):
                raise ValueError("invalid state: dataset is not an identity string")
            self._native.check_dataset(state["dataset"])
        if "global_batches" in state:
            position = _count("global_batches", state["global_batches"])
        else:  # a state from before elastic resumes: this rank's count at the saved world
            position = _count("batches_taken", state["batches_taken"]) * _count(
                "world", saved.get("world", self.world))
        self._batches.seek(_count("epoch", state["epoch"]), position, 0)
        self._loaded = self._batches.position()
        self._resumed = self._loaded[:2]

    def map(self, function: BatchFunction) -> MappedLoader:
        """This loader with each batch as ``function(batch, epoch)`` makes it (``epoch``: the
        epoch the batch belongs to, for transforms that draw anew each epoch, such as
        ``time_ordered(..., keep="random")``): the dataloader a training framework takes
        when the model wants something else than the batch, such as padded sequences
        (``shardify.transforms.pulse_sequences``). Its length, epochs, sampler and state are
        this loader's (a Lightning checkpoint resumes it mid-epoch), and iterating it
        iterates this loader. A lambda cannot be pickled: where a framework pickles its
        dataloader (Lightning's ``ddp_spawn``), map a function defined at a module's top
        level."""
        return MappedLoader(self, function)

    def __getitem__(self, index: Any) -> Any:
        """Refused, saying why: torch's ``DataLoader`` given a loader as its dataset reads it
        as a map-style dataset (it has a length) and asks for ``loader[i]``."""
        raise not_indexed("a shardify.Loader")

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpickled_loader, (self.dataset, self._arguments, self.state_dict())

    @property
    def staging_allocations(self) -> int:
        """Batch buffers allocated since the first batch, over all epochs and seeks: the
        streaming loader's staging buffers, or a resident loader's output buffers (constant
        in the steady state)."""
        if isinstance(self._batches, _Streaming):
            return self._native.staging_allocations()
        return self._batches.pool.allocations

    def __repr__(self) -> str:
        if not self.__dict__.get("_made"):
            # Its construction raised (a traceback's locals show it, as does a loader whose
            # rebuild for a new rank or device failed): no field to show but that.
            return "shardify.Loader (not made: its construction raised)"
        kind = ", resident" if self.resident else ""
        return (
            f"shardify.Loader({self.dataset.path!r}, rank {self.rank} of {self.world}, "
            f"device {self.device}{kind}, epoch {self.epoch})"
        )


class _Streaming:
    """The streaming loader's batches, its sections as numpy arrays (``np.from_dlpack``)."""

    def __init__(self, native: Any, names: tuple[str, ...]):
        import numpy

        self._native, self._names, self._np = native, names, numpy

    def position(self) -> tuple[int, int, int]:
        """(epoch, origin, batches handed out since origin)."""
        epoch, origin, taken = self._native.position()
        return int(epoch), int(origin), int(taken)

    def seek(self, epoch: int, origin: int, batches_taken: int) -> None:
        """Moves to batch ``batches_taken`` of ``epoch`` dealt from global batch ``origin``."""
        self._native.seek(epoch, origin, batches_taken)

    def next(self) -> dict[str, Any] | None:
        """The next batch of the epoch, or ``None`` (and the next epoch's start) at its end."""
        sections = self._native.next_batch()
        if sections is None:
            return None
        return dict(zip(self._names, map(self._np.from_dlpack, sections), strict=True))


class _TorchBatches(_Streaming):
    """The streaming loader's batches as torch tensors: one native call per batch makes
    every section's tensor without copying, through torch's DLPack C exchange API
    (``torch.Tensor.__dlpack_c_exchange_api__`` in recent torch: one C call a
    section), or on older torch through torch's capsule import of a DLPack capsule per
    section (a third of the time ``torch.from_dlpack`` on each section takes: 17 against
    48 µs for ten), and builds the batch's dict. On CUDA the batch's copy is ordered before
    torch's current stream, as ``torch.from_dlpack`` would order it."""

    def __init__(self, native: Any, names: tuple[str, ...], device: Any):
        import torch

        super().__init__(native, names)
        self._torch = torch
        # torch's own capsule import, where the exchange API is missing; its public
        # wrapper adds checks that cost 1.3 µs a call.
        self._convert = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
        self._cuda = device if device.type == "cuda" else None

    def next(self) -> dict[str, Any] | None:
        """The next batch of the epoch, or ``None`` (and the next epoch's start) at its end."""
        # DLPack's stream argument, as torch.from_dlpack passes it (1: the legacy default
        # stream). Asking for it also initialises torch's CUDA state, which the exchange API
        # does not.
        stream = None if self._cuda is None else (
            self._torch.cuda.current_stream(self._cuda).cuda_stream or 1)
        batch: dict[str, Any] | None = self._native.next_batch_dict(
            self._convert, stream, self._torch.Tensor)
        return batch


def _unpickled_loader(dataset: Dataset, arguments: dict[str, Any],
                      state: dict[str, Any]) -> Loader:
    """A pickled loader made again: the same arguments, on the same dataset, at its saved
    position."""
    loader = Loader(dataset, **arguments)
    loader.load_state_dict(state)
    return loader


def _resident_device(device: str) -> tuple[Any, str]:
    """The torch device a resident loader holds the dataset on, and on the CPU why."""
    import torch

    if device in ("auto", "cuda"):
        current = _torch_current_cuda()
        if current is not None:
            return torch.device("cuda", current), ""
        if device == "auto":
            return torch.device("cpu"), "torch sees no CUDA device"
        device = "cuda:0"
    reason = "requested" if device == "cpu" else ""
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"invalid device: {device!r} (expected auto, cpu, cuda, cuda:N or a torch.device)"
        ) from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device}: torch sees no CUDA device (driver or GPU missing)")
    if chosen.type == "cuda" and (chosen.index or 0) >= torch.cuda.device_count():
        raise RuntimeError(f"device {device}: torch sees {torch.cuda.device_count()} CUDA "
                           "devices")
    if chosen.type not in ("cpu", "cuda"):
        raise ValueError(f"invalid device: {device!r} (expected auto, cpu, cuda or cuda:N)")
    return chosen, reason
