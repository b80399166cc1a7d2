"""Loader.map (shardify.MappedLoader) and pulse_sequences: each batch through a function,
with the loader's length, epochs, state and stream; a transformer's padded input in one
call."""

import functools
import pickle

import pytest
import shardify
from conftest import order_lines


def tagged(batch, epoch):
    """What the tests map: the batch's event ids and the epoch it was handed."""
    return epoch, batch["event_id"].tolist()


def test_a_mapped_loader_is_the_loader_with_each_batch_mapped(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=16, seed=3)
    mapped = loader.map(tagged)
    assert isinstance(mapped, shardify.MappedLoader) and mapped.loader is loader
    assert (len(mapped), mapped.epoch, mapped.dataset, mapped.batch_sampler) == (
        len(loader), 0, loader.dataset, None)
    assert mapped.sampler is loader.sampler
    epochs = [order_lines(train_dir, "--batch-events", "16", "--seed", "3", "--epoch", e)
              for e in ("0", "1", "4")]
    assert list(mapped) == [(0, ids) for ids in epochs[0]]
    assert list(mapped) == [(1, ids) for ids in epochs[1]]
    mapped.set_epoch(4)
    assert (mapped.epoch, loader.epoch) == (4, 4)
    assert list(mapped) == [(4, ids) for ids in epochs[2]]
    assert repr(mapped) == f"shardify.MappedLoader({loader!r}, tagged)"


def test_a_mapped_loader_resumes_mid_epoch_from_its_state(train_dir, torch):
    """A checkpoint's state, taken inside the loop, resumes at the next batch, mapped."""
    whole = list(shardify.Loader(train_dir, batch_events=16, seed=5).map(tagged))  # epoch 0
    resumed_from = shardify.Loader(train_dir, batch_events=16, seed=5).map(tagged)
    taken = []
    for item in resumed_from:
        taken.append(item)
        if len(taken) == 5:
            state = resumed_from.state_dict()
            break
    assert state == resumed_from.loader.state_dict() and state["batches_taken"] == 5
    fresh = shardify.Loader(train_dir, batch_events=16, seed=5).map(tagged)
    fresh.load_state_dict(state)
    assert taken + list(fresh) == whole
    # Pickled (a framework's worker or checkpoint), a module-level function and all.
    again = pickle.loads(pickle.dumps(shardify.Loader(train_dir, batch_events=16, seed=5).map(
        functools.partial(tagged))))
    assert list(again) == whole


def test_a_mapped_loader_is_one_stream_and_refuses_what_cannot_map(train_dir, torch):
    mapped = shardify.Loader(train_dir, batch_events=16).map(tagged)
    older = iter(mapped)
    next(older)
    newer = iter(mapped)
    assert next(newer)[0] == 0
    with pytest.raises(RuntimeError, match="iterated again"):
        next(older)
    with pytest.raises(TypeError, match="needs a function\\(batch, epoch\\), not builtins.int"):
        shardify.Loader(train_dir, batch_events=16).map(3)


@pytest.mark.parametrize("standardize", [None, "graphnet"])
def test_pulse_sequences_is_time_ordered_then_features_then_padding(realistic_dir, torch,
                                                                     standardize):
    from shardify.transforms import pad_pulses, pulse_features, pulse_sequences, time_ordered

    loader = shardify.Loader(realistic_dir, batch_events=32, seed=2)
    sequences = loader.map(functools.partial(_sequences, standardize=standardize))
    for i, (epoch, got) in enumerate(sequences):
        if i == 3:
            break
        batch = got.pop("batch")
        pulses = time_ordered(batch, max_pulses=48, keep="random", seed=9, epoch=epoch)
        pulses["pulse_features"] = pulse_features(pulses, standardize)
        want = pad_pulses(pulses, 48)
        assert got.keys() == want.keys() and "event_azimuth" in got
        for name in want:
            assert torch.equal(got[name], want[name]), name
        assert got["pulse_features"].shape == (32, 48, 6)
    batch = next(iter(loader))
    for length in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="length must be a positive integer"):
            pulse_sequences(batch, length)
    with pytest.raises(ValueError, match="invalid standardize"):
        pulse_sequences(batch, 8, standardize="z")
    with pytest.raises(ValueError, match="^pulse_sequences needs a packed batch with "
                                         "dom_position"):
        pulse_sequences({k: v for k, v in batch.items() if k != "dom_position"}, 8)


def test_pulse_sequences_pad_length_grouped_batches_to_their_longest(realistic_dir, torch):
    from shardify.transforms import pad_pulses, pulse_features, pulse_sequences, time_ordered

    loader = shardify.Loader(realistic_dir, batch_events=32, block_events=64, window_blocks=8,
                             group_by_length=100)
    widths, cells, pulses_kept = set(), 0, 0
    for batch in loader:
        got = pulse_sequences(batch, 100, padding="longest", pad_to_multiple_of=16)
        pulses = time_ordered(batch, max_pulses=100)
        pulses["pulse_features"] = pulse_features(pulses)
        longest = int(pulses["event_pulse_offsets"].diff().max())
        width = min(-(-longest // 16) * 16, 100)
        want = pad_pulses(pulses, width)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name
        widths.add(width)
        cells += got["pulse_mask"].numel()
        pulses_kept += int(got["event_pulses"].sum())
    assert widths <= {16, 32, 48, 64, 80, 96, 100} and len(widths) > 3, widths
    assert pulses_kept / cells > 0.75, "grouped batches padded to their longest: little padding"
    # Every rule of choosing the kept pulses, at both paddings, as the three calls make it.
    for keep in ("non_auxiliary_first", "random", "charge"):
        pulses = time_ordered(batch, max_pulses=40, keep=keep, seed=4, epoch=1)
        pulses["pulse_features"] = pulse_features(pulses, "graphnet")
        longest = int(pulses["event_pulse_offsets"].diff().max())
        for padding, width in (("length", 40), ("longest", longest)):
            got = pulse_sequences(batch, 40, keep=keep, seed=4, epoch=1, padding=padding,
                                  standardize="graphnet")
            want = pad_pulses(pulses, width)
            assert list(got) == list(want), keep
            for name in want:
                assert got[name].dtype == want[name].dtype, (keep, name)
                assert torch.equal(got[name], want[name]), (keep, padding, name)
    longest = pulse_sequences(batch, 100, padding="longest")
    assert longest["pulse_time"].shape[1] == int(longest["event_pulses"].max())
    with pytest.raises(ValueError, match="invalid padding: 'max'"):
        pulse_sequences(batch, 100, padding="max")
    with pytest.raises(ValueError, match="give it with padding=\"longest\""):
        pulse_sequences(batch, 100, pad_to_multiple_of=8)


def _sequences(batch, epoch, standardize):
    from shardify.transforms import pulse_sequences

    out = pulse_sequences(batch, 48, keep="random", standardize=standardize, seed=9,
                          epoch=epoch)
    return epoch, {**out, "batch": batch}
