"""Dataset.split: disjoint views chosen by a hash of event_id, usable wherever a Dataset is."""

import pytest
import shardify
from conftest import FIXTURES, run_cli


def events_of(view):
    return view.event_ids().tolist()


def test_a_split_is_disjoint_complete_and_exact(train_dir, stored):
    ds = shardify.Dataset(train_dir)
    train, val = ds.split(0.2, seed=0)
    assert (len(train), len(val)) == (240, 60), "round(0.2 x 300) chosen, exactly"
    assert not train.whole and ds.whole
    a, b = set(events_of(train)), set(events_of(val))
    assert not a & b and a | b == set(events_of(ds))
    for view, ids in ((train, a), (val, b)):
        assert view.doms == sum(len(stored.event(e)["dom_sensor_id"]) for e in ids)
        assert view.pulses == sum(len(stored.event(e)["pulse_time"]) for e in ids)
    assert view.manifest == ds.manifest, "a split's manifest is its dataset's"
    # Another seed, another split; the same seed, the same split.
    assert set(events_of(ds.split(0.2, seed=1)[1])) != b
    assert set(events_of(ds.split(0.2, seed=0)[1])) == b
    assert [len(v) for v in ds.split(0.0)] == [300, 0]
    assert [len(v) for v in ds.split(1.0)] == [0, 300]


def test_a_split_does_not_depend_on_the_conversion(train_dir, tmp_path):
    other = tmp_path / "other"
    run_cli("convert", str(FIXTURES), str(other), "--split", "train", "--seed", "7")
    first = shardify.Dataset(train_dir)
    second = shardify.Dataset(other)
    assert first.manifest["shards"] != second.manifest["shards"]
    assert set(events_of(first.split(0.1, seed=3)[1])) == set(
        events_of(second.split(0.1, seed=3)[1]))


@pytest.mark.parametrize("resident", [False, True])
def test_a_view_goes_wherever_a_dataset_does(train_dir, torch, resident):
    train, val = shardify.Dataset(train_dir).split(0.3, seed=5)
    for view in (train, val):
        loader = shardify.Loader(view, batch_events=16, device="cpu", resident=resident)
        length = len(loader)
        batches = [{k: v.clone() for k, v in b.items()} for b in loader]
        assert len(batches) == length
        ids = [e for b in batches for e in b["event_id"].tolist()]
        assert sorted(ids) == sorted(events_of(view)), "every event of the view, once"
        assert sum(len(b["pulse_time"]) for b in batches) == view.pulses
    # The sections of a view's batches are those of the same events read whole.
    streamed = [{k: v.clone() for k, v in b.items()}
                for b in shardify.Loader(val, batch_events=16, device="cpu", seed=2)]
    resident_batches = list(shardify.Loader(val, batch_events=16, device="cpu", seed=2,
                                            resident=True))
    for want, got in zip(streamed, resident_batches, strict=True):
        assert list(want) == list(got)
        for name in want:
            assert torch.equal(want[name], got[name]), name


def test_a_view_of_a_view_and_bad_fractions(train_dir):
    ds = shardify.Dataset(train_dir)
    rest, chosen = ds.split(0.5, seed=1)
    inner_rest, inner = chosen.split(0.5, seed=2)
    assert len(inner) + len(inner_rest) == len(chosen) == 150
    assert set(events_of(inner)) <= set(events_of(chosen))
    for bad in (-0.1, 1.5, float("nan"), "half", True):
        with pytest.raises(ValueError, match="fraction"):
            ds.split(bad)
    for bad in (-1, 2**64, 0.5, True):
        with pytest.raises(ValueError, match="invalid seed"):
            ds.split(0.5, seed=bad)
