"""Evaluation and inference: ``shuffle=False`` delivers every event exactly once, in stored
order, the last partial batch kept, no event on two ranks; predictions gather over ranks."""

import numpy as np
import pytest
import shardify
from shardify.distributed import gather_predictions


@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("world", [1, 3])
def test_every_event_once_in_stored_order(train_dir, torch, world, resident):
    stored = shardify.Dataset(train_dir).event_ids()
    assert len(stored) == 300 and len(set(stored.tolist())) == 300
    per_rank = []
    for rank in range(world):
        loader = shardify.Loader(train_dir, batch_events=32, shuffle=False, rank=rank,
                                 world=world, device="cpu", resident=resident)
        assert not loader.drop_last, "shuffle=False implies drop_last=False"
        epochs = [[b["event_id"].tolist() for b in loader] for _ in range(2)]
        assert epochs[0] == epochs[1], "the same order every epoch"
        assert len(loader) == len(epochs[1])
        per_rank.append(epochs[0])
    # Ten batches (the last of 12 events) dealt round-robin: unequal counts are allowed.
    assert [len(r) for r in per_rank] == ([10] if world == 1 else [4, 3, 3])
    batches = [per_rank[k % world][k // world] for k in range(10)]
    assert [len(b) for b in batches] == [32] * 9 + [12], "the last partial batch is kept"
    assert [e for b in batches for e in b] == stored.tolist(), "stored order, each once"


def test_the_seed_and_window_do_not_matter_without_shuffle(train_dir, torch):
    a = [b["event_id"].tolist() for b in shardify.Loader(
        train_dir, batch_events=50, shuffle=False, seed=1, device="cpu")]
    b = [b["event_id"].tolist() for b in shardify.Loader(
        train_dir, batch_events=50, shuffle=False, seed=9, window_blocks=1, block_events=7,
        device="cpu")]
    assert a == b


def test_drop_last_may_still_be_asked_for(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=32, shuffle=False, drop_last=True,
                             device="cpu")
    assert [len(b["event_id"]) for b in loader] == [32] * 9


def test_gather_predictions_without_a_process_group(torch):
    ids = torch.tensor([5, 3, 9])
    values = torch.tensor([[0.5, 1.0], [0.1, 0.2], [0.3, 0.4]])
    got_ids, got_values = gather_predictions(ids, values)
    assert torch.equal(got_ids, ids) and torch.equal(got_values, values)
    with pytest.raises(ValueError, match="event id 3 came twice"):
        gather_predictions(torch.tensor([3, 4, 3]), torch.zeros(3))
    with pytest.raises(ValueError, match="2 rows beside 3 event ids"):
        gather_predictions(ids, torch.zeros(2))


def test_event_ids_are_the_stored_order(train_dir, stored):
    want = np.concatenate([s["event_id"] for s in stored.shards])
    np.testing.assert_array_equal(shardify.Dataset(train_dir).event_ids(), want)
