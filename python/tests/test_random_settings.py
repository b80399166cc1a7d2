"""The loader's guarantees under settings drawn at random, each case from its own seed (so a
failure names the case that reproduces it): a fixed batch size or a pulse or token budget,
grouped by length or not, any block, window and run size, either batch order, with or
without shuffle, 1 to 3 workers, streamed or resident, packed or padded batches, 1 to 5
ranks, with or without ``drop_last``, from a dataset of 21 shards in either layout.

Each case checks, for one epoch: ``len()`` is what each rank hands out; no event comes
twice across the ranks; every event comes without ``drop_last``, and every rank gets as
many batches with it; the records copy gives the same batches byte for byte as the columns
dataset; ``shardify order`` lists the last rank's batches; and rank 0's state saved after
a random number of batches, resumed at another world size (with or without
``drop_last``), hands out exactly the events not yet trained, never more batches than
``len()`` says."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shardify
from conftest import IN_CI, generated_source, order_lines, run_cli

CASES = 80
EVENTS = 3000
# Resident cases deliver torch tensors: drawn wherever torch is installed, and always in CI,
# where its absence is a failure (as conftest.required_in_ci makes it), not fewer cases.
RESIDENT = IN_CI or importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> tuple[Path, Path, set[int]]:
    """3,000 generated events in 21 shards, as converted (columns) and copied as records,
    and their event ids."""
    root = tmp_path_factory.mktemp("random_settings")
    columns, records = root / "columns", root / "records"
    run_cli("convert", str(generated_source(root, EVENTS, 3)), str(columns), "--seed", "5",
            "--shard-size", "256KiB")
    run_cli("copy", str(columns), str(records), "--layout", "records")
    every = shardify.Loader(columns, batch_events=EVENTS, shuffle=False, device="cpu",
                            output="numpy")
    ids = {int(e) for batch in every for e in batch["event_id"]}
    assert len(ids) == EVENTS
    return columns, records, ids


def drawn_settings(rng: random.Random) -> dict[str, Any]:
    """One loader's settings, every combination the loader accepts."""
    settings: dict[str, Any] = dict(
        seed=rng.randrange(1000), block_events=rng.choice([1, 7, 64, 256, 1000]),
        window_blocks=rng.choice([1, 2, 3, 16, 10**6]), run_events=rng.choice([1, 1, 4, 33]),
        batch_order=rng.choice(["stored", "drawn"]), shuffle=rng.random() < 0.85,
        workers=rng.choice([1, 2, 3]), device="cpu", output="numpy")
    if RESIDENT and rng.random() < 0.25:
        settings.update(resident=True, output="torch")
    kind = rng.choice(["events", "pulses", "tokens"])
    if kind == "events":
        settings["batch_events"] = rng.choice([1, 5, 64, 300, 2999, 5000])
    elif kind == "pulses":
        settings["max_pulses"] = rng.choice([2000, 20000, 200000])
        if rng.random() < 0.5:
            settings["pulse_cap"] = rng.choice([50, 500])
        if rng.random() < 0.3:
            settings["max_events"] = rng.choice([3, 40])
    else:
        settings["max_tokens"] = rng.choice([5000, 65536])
        if rng.random() < 0.5:
            settings["pad_to_multiple_of"] = rng.choice([8, 16])
    if kind == "tokens" or (kind == "events" and rng.random() < 0.4):
        settings["group_by_length"] = rng.choice([True, 8, 256])
        settings["length_of"] = rng.choice(["pulses", "doms"])
    if rng.random() < 0.35:
        max_doms = rng.choice([1, 8, 64, 500])
        settings.update(layout="padded", max_doms=max_doms,
                        pulses_per_dom=rng.choice([1, 3, 8]))
        if kind == "tokens" and settings["length_of"] == "doms":
            settings["group_by_length"] = max_doms  # a budget of the rows the grids keep
    return settings


def order_arguments(settings: dict[str, Any], rank: int, world: int, drop_last: bool,
                    number: int) -> list[str]:
    """``shardify order``'s arguments for the same batches as a loader with ``settings``."""
    flags = {"seed": "--seed", "block_events": "--block-events", "window_blocks": "--window",
             "run_events": "--run-events", "batch_order": "--batch-order",
             "batch_events": "--batch-events", "max_pulses": "--max-pulses",
             "pulse_cap": "--pulse-cap", "max_events": "--max-events",
             "max_tokens": "--max-tokens", "pad_to_multiple_of": "--pad-to-multiple-of",
             "length_of": "--length-of"}
    args = [part for name, flag in flags.items() if name in settings
            for part in (flag, str(settings[name]))]
    grouping = settings.get("group_by_length")
    if grouping is not None:
        args += ["--group-by-length"] + ([] if grouping is True else [str(grouping)])
    args += [] if settings["shuffle"] else ["--no-shuffle"]
    args += ["--rank", str(rank), "--world", str(world), "--epoch", str(number)]
    return args + (["--drop-last"] if drop_last else [])


def contents(batch: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """A batch's every section as dtype, shape and bytes (numpy arrays or torch tensors)."""
    return {name: (str(a.dtype), tuple(a.shape), np.asarray(a).tobytes())
            for name, a in batch.items()}


def epoch(dataset: Path, settings: dict[str, Any], world: int, drop_last: bool | None,
          number: int, state: dict | None = None) -> list[list[dict]]:
    """Each rank's batches of epoch ``number`` (from ``state`` where given), as
    :func:`contents`; checks that each rank hands out at most ``len()`` batches, exactly
    ``len()`` from the epoch's start."""
    ranks = []
    for rank in range(world):
        loader = shardify.Loader(dataset, rank=rank, world=world, drop_last=drop_last,
                                 **settings)
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(number)
        length = len(loader)
        batches = [contents(b) for b in loader]
        if state is None:
            assert len(batches) == length, (rank, len(batches), length)
        else:
            assert len(batches) <= length, (rank, len(batches), length)
        ranks.append(batches)
    return ranks


def event_ids(batches: list[dict]) -> list[int]:
    """The event ids of ``batches`` (as :func:`contents`), in order."""
    return [e for b in batches for e in np.frombuffer(b["event_id"][2], np.int64).tolist()]


@pytest.mark.parametrize("case", range(CASES))
def test_random_settings_keep_every_guarantee(layouts, case):
    columns, records, every = layouts
    rng = random.Random(case)
    settings = drawn_settings(rng)
    world = rng.choice([1, 2, 3, 5])
    drop_last = rng.choice([None, False, True]) if world > 1 else rng.choice([None, False])
    dropping = drop_last if drop_last is not None else world > 1 and settings["shuffle"]
    number = rng.randrange(3)

    ranks = epoch(columns, settings, world, drop_last, number)
    seen = [e for batches in ranks for e in event_ids(batches)]
    assert len(seen) == len(set(seen)), "an event came twice"
    assert set(seen) <= every
    if dropping:
        assert len({len(batches) for batches in ranks}) == 1, "unequal batch counts"
    else:
        assert set(seen) == every, f"{len(every - set(seen))} events never came"
    assert epoch(records, settings, world, drop_last, number) == ranks, "the layouts differ"
    last = world - 1
    assert order_lines(columns, *order_arguments(settings, last, world, dropping, number)) \
        == [event_ids([b]) for b in ranks[last]], "shardify order lists other batches"

    taken = rng.randrange(min(len(batches) for batches in ranks) + 1)
    first = shardify.Loader(columns, rank=0, world=world, drop_last=drop_last, **settings)
    first.set_epoch(number)
    batches = iter(first)
    for _ in range(taken):
        next(batches)
    state = first.state_dict()
    trained = [e for batches in ranks for e in event_ids(batches[:taken])]
    world_after = rng.choice([1, 2, 3, 4])
    dropping_after = rng.choice([False, True]) if world_after > 1 else False
    rest = epoch(columns, settings, world_after, dropping_after, number, state)
    both = trained + [e for batches in rest for e in event_ids(batches)]
    assert len(both) == len(set(both)), f"an event came twice across {world} -> {world_after}"
    if dropping_after:
        assert len({len(batches) for batches in rest}) == 1, "unequal counts after the resume"
    else:
        assert set(both) == every, f"{len(every - set(both))} events lost by the resume"
