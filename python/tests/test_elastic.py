"""Elastic resume: a state saved at one world size resumes at another, and the ranks of the
new world see the rest of the epoch, no event twice, none skipped beyond what drop_last
drops. Ranks are simulated in one process with explicit rank and world."""

import weakref

import pytest
import shardify
from conftest import assert_freed, ids, order_lines, take

SETTINGS = dict(batch_events=8, seed=3, window_blocks=4)
FLAGS = ["--batch-events", "8", "--seed", "3", "--window", "4"]


def expected_after_resume(train_dir, saved_global, new_world, new_drop_last):
    """The global batches (event ids) a job sees when it resumes at ``saved_global`` with
    ``new_world`` ranks: every batch before, then those the new world deals."""
    every = order_lines(train_dir, *FLAGS)  # world 1, no drop: every global batch in order
    end = len(every)
    if new_drop_last:
        usable = end if len(every[-1]) == 8 else end - 1
        end = saved_global + (usable - saved_global) - (usable - saved_global) % new_world
    return every[:saved_global] + every[saved_global:end]


@pytest.mark.parametrize("old,new,resident", [(2, 3, False), (3, 1, False), (1, 8, False),
                                              (2, 3, True)])
def test_a_state_resumes_at_another_world_size(train_dir, torch, old, new, resident):
    steps = 4
    seen = []
    for rank in range(old):  # every rank of the old world steps 4 times; rank 0 saves
        loader = shardify.Loader(train_dir, rank=rank, world=old, device="cpu", **SETTINGS)
        seen.extend(take(loader, steps))
        if rank == 0:
            state = loader.state_dict()
    assert state["global_batches"] == steps * old and state["world"] == old
    per_rank = []
    for rank in range(new):  # drop_last follows the world: it may differ from the old one
        loader = shardify.Loader(train_dir, rank=rank, world=new, device="cpu",
                                 resident=resident, **SETTINGS)
        assert loader.drop_last == (new > 1)
        loader.load_state_dict(state)
        # len() counts the epoch from its start at this world, as a DataLoader's does
        # (Lightning counts a checkpoint's batches against it): never fewer than the rest.
        fresh = shardify.Loader(train_dir, rank=rank, world=new, device="cpu", **SETTINGS)
        length = len(loader)
        assert length == len(fresh) == len(list(fresh))
        rest = [b["event_id"].tolist() for b in loader]
        assert len(rest) <= length
        per_rank.append(rest)
    if new > 1:
        assert len({len(r) for r in per_rank}) == 1, "every rank as many batches"
    for r in per_rank:
        seen.extend(r)
    events = [e for batch in seen for e in batch]
    assert len(events) == len(set(events)), "no event twice"
    want = expected_after_resume(train_dir, steps * old, new, new > 1)
    want_events = sorted(int(e) for line in want for e in line)
    assert sorted(events) == want_events
    # The batches themselves, in the new world's round-robin order.
    dealt = [per_rank[k % new][k // new] for k in range(sum(map(len, per_rank)))]
    assert dealt == [[int(e) for e in line] for line in want[steps * old:]]


def test_a_resumed_rank_saves_a_global_position_again(train_dir, torch):
    loader = shardify.Loader(train_dir, rank=1, world=2, device="cpu", **SETTINGS)
    loader.load_state_dict({**loader.state_dict(), "global_batches": 6})
    take(loader, 3)
    state = loader.state_dict()
    assert (state["global_batches"], state["batches_taken"]) == (6 + 3 * 2, 3)
    # The next epoch starts afresh.
    for _ in loader:
        pass
    assert loader.state_dict()["global_batches"] == 0 and loader.epoch == 1


def test_a_state_from_before_global_positions_still_loads(train_dir, torch):
    loader = shardify.Loader(train_dir, rank=0, world=2, device="cpu", **SETTINGS)
    legacy = {"epoch": 0, "batches_taken": 3,
              "sampler": {**loader.state_dict()["sampler"], "world": 2, "drop_last": True}}
    del legacy["sampler"]["shuffle"]
    loader.load_state_dict(legacy)
    assert loader.state_dict()["global_batches"] == 6
    assert [b["event_id"].tolist() for b in loader] == [
        [int(e) for e in line]
        for line in order_lines(train_dir, *FLAGS, "--world", "2", "--drop-last")[3:]]


def test_shardify_order_resumes_elastically_too(train_dir, tmp_path):
    state = tmp_path / "state.json"
    first = [order_lines(train_dir, *FLAGS, "--rank", str(r), "--world", "3", "--drop-last",
                         "--stop-after", "2", "--save-state", str(state)) for r in range(3)]
    rest = [order_lines(train_dir, *FLAGS, "--rank", str(r), "--world", "2", "--drop-last",
                        "--resume", str(state)) for r in range(2)]
    python = shardify.Loader(train_dir, rank=1, world=2, device="cpu", output="numpy",
                             **SETTINGS)
    python.load_state_dict({**python.state_dict(), "global_batches": 6})
    assert [b["event_id"].tolist() for b in python] == rest[1]
    ids = [e for part in (first, rest) for r in part for line in r for e in line]
    assert len(ids) == len(set(ids))


def test_a_loader_made_before_its_process_group_finds_its_rank_when_used(train_dir, torch,
                                                                          monkeypatch):
    # PyTorch Lightning's DDP starts the processes' groups after the script made the
    # loader it was given: as made, every process would be rank 0 of 1 and read it all.
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    early = shardify.Loader(train_dir, device="cpu", **SETTINGS)
    loaded = shardify.Loader(train_dir, device="cpu", **SETTINGS)
    loaded.load_state_dict({**loaded.state_dict(), "global_batches": 6})
    assert (early.rank, early.world, early.drop_last) == (0, 1, False)
    stale = iter(early)  # an iterator made as rank 0 of 1, not yet advanced
    as_made = weakref.ref(early._batches)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    rank_1_of_3 = order_lines(train_dir, *FLAGS, "--rank", "1", "--world", "3", "--drop-last")
    assert len(early) == len(rank_1_of_3)  # taken into use: found again
    assert_freed(as_made, "the loader as made (its native threads and staging buffers)")
    # The iterator over the loader as it was made would hand out rank 0 of 1's batches.
    with pytest.raises(RuntimeError, match="made again for the process's new rank"):
        next(stale)
    assert (early.rank, early.world, early.drop_last) == (1, 3, True)
    assert ids(early) == rank_1_of_3
    # A position loaded before is kept, as a global one: the rest dealt to the new world.
    given = shardify.Loader(train_dir, rank=1, world=3, device="cpu", **SETTINGS)
    given.load_state_dict(loaded.state_dict())
    assert ids(loaded) == ids(given) and loaded.world == 3
    # Rank and world given are kept whatever the process says.
    fixed = shardify.Loader(train_dir, rank=0, world=1, device="cpu", **SETTINGS)
    assert len(list(fixed)) == len(order_lines(train_dir, *FLAGS)) and fixed.world == 1
