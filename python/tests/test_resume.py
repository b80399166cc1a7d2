"""state_dict / load_state_dict: resume exactly after the last batch handed out."""

import pytest
import shardify
from conftest import FIXTURES, ids, order_lines, run_cli


def test_resume_mid_epoch_gives_exactly_the_rest(train_dir, torch):
    full = order_lines(train_dir, "--batch-events", "8", "--epoch", "2")
    loader = shardify.Loader(train_dir, batch_events=8, prefetch=6)
    loader.set_epoch(2)
    taken = []
    for batch in loader:
        taken.append(batch["event_id"].tolist())
        if len(taken) == 11:
            break
    state = loader.state_dict()  # prefetched batches beyond the 11th are not counted
    assert state["epoch"] == 2 and state["batches_taken"] == 11
    del loader
    resumed = shardify.Loader(train_dir, batch_events=8)
    resumed.load_state_dict(state)
    rest = ids(resumed)
    assert taken + rest == full
    assert resumed.state_dict()["epoch"] == 3, "the epoch's end moves to the next"
    assert ids(resumed) == order_lines(train_dir, "--batch-events", "8", "--epoch", "3")


def test_the_same_loop_continues_after_break(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=8)
    first = []
    for batch in loader:
        first.append(batch["event_id"].tolist())
        if len(first) == 5:
            break
    assert first + ids(loader) == order_lines(train_dir, "--batch-events", "8")


def test_a_state_saved_on_rank_0_resumes_rank_1(train_dir, torch):
    rank0 = shardify.Loader(train_dir, batch_events=8, rank=0, world=2)
    it = iter(rank0)
    for _ in range(3):
        next(it)
    state = rank0.state_dict()
    assert "rank" not in state["sampler"]
    rank1 = shardify.Loader(train_dir, batch_events=8, rank=1, world=2)
    rank1.load_state_dict(state)
    expected = order_lines(train_dir, "--batch-events", "8", "--rank", "1", "--world", "2",
                           "--drop-last")
    assert ids(rank1) == expected[3:]


@pytest.mark.parametrize("field,other", [
    ("seed", {"seed": 1}),
    ("batching", {"batch_events": 9}),
    ("batching", {"max_pulses": 500}),
    ("block_events", {"block_events": 64}),
    ("window_blocks", {"window_blocks": 2}),
    ("run_events", {"run_events": 4}),
    ("batch_order", {"batch_order": "drawn"}),
    ("shuffle", {"shuffle": False}),
])
def test_a_state_from_other_settings_is_refused(train_dir, torch, field, other):
    state = shardify.Loader(train_dir, batch_events=8).state_dict()
    loader = shardify.Loader(train_dir, **{"batch_events": 8, **other})
    with pytest.raises(ValueError, match=field):
        loader.load_state_dict(state)


def test_a_state_resumes_on_a_copy_but_not_on_other_events(train_dir, torch, tmp_path):
    loader = shardify.Loader(train_dir, batch_events=8)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    identity = state["dataset"]
    assert isinstance(identity, str) and len(identity) == 16
    expected = ids(it)
    assert expected
    # A copy elsewhere in the other layout holds the same events: the same rest.
    copy = tmp_path / "records"
    shardify.copy_dataset(train_dir, copy, layout="records")
    on_copy = shardify.Loader(copy, batch_events=8)
    on_copy.load_state_dict(state)
    assert ids(on_copy) == expected
    # Another conversion of the same source, and a split: refused, streaming or resident.
    other = tmp_path / "other"
    run_cli("convert", str(FIXTURES), str(other), "--split", "train", "--seed", "43",
            "--shard-size", "64KiB")
    train, _ = shardify.Dataset(train_dir).split(0.25, 0)
    for events, named in [(other, "other"), (train, "a part of")]:
        for resident in (False, True):
            refusing = shardify.Loader(events, batch_events=8, resident=resident, device="cpu")
            with pytest.raises(ValueError, match=f"invalid dataset: .*{identity}.*{named}"):
                refusing.load_state_dict(state)
            assert refusing.state_dict()["global_batches"] == 0, "nothing was resumed"
