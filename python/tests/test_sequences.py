"""SequenceLoader: a loader through pulse_sequences, and a token budget's grids within it."""

import pickle
import warnings

import pytest
import shardify
from conftest import assert_same_batches

#: A token budget over the 300 train events that cuts them into several batches a window.
BUDGET = dict(max_tokens=2048, max_events=64, block_events=32, window_blocks=8, device="cpu")


def cells(grids):
    """Each grid's cells (events times padded length)."""
    return [grid["pulse_mask"].numel() for grid in grids]


def test_sequence_loader_is_its_loader_through_pulse_sequences(train_dir, torch):
    from shardify.sequences import SequenceLoader
    from shardify.transforms import pulse_sequences

    def loader(**settings):
        return shardify.Loader(train_dir, batch_events=32, seed=5, device="cpu", **settings)

    arguments = dict(keep="random", standardize="graphnet", seed=3)
    sequences = SequenceLoader(loader(), 24, **arguments)
    plain = loader()
    assert len(sequences) == len(plain) and sequences.sampler is sequences.loader.sampler
    assert sequences.pulse_sequences_arguments == dict(arguments, padding="length")
    epochs = []
    for epoch in (0, 1):  # keep="random" draws with the loader's epoch: epochs differ
        want = [pulse_sequences(b, 24, epoch=epoch, **arguments) for b in plain]
        got = list(sequences)
        assert sequences.epoch == plain.epoch == epoch + 1
        assert_same_batches(want, got, torch)
        assert all(grid["pulse_mask"].shape[1] == 24 for grid in got)  # padded to length
        epochs.append(got)
    assert any(not torch.equal(a["pulse_features"], b["pulse_features"])
               for a, b in zip(*epochs, strict=True))
    # State, set_epoch and len are the loader's; a state resumes mid-epoch.
    sequences.set_epoch(4)
    first = [g for _, g in zip(range(3), sequences, strict=False)]
    state = sequences.state_dict()
    assert (state["epoch"], state["global_batches"]) == (4, 3)
    resumed = SequenceLoader(loader(), 24, **arguments)
    resumed.load_state_dict(state)
    plain.set_epoch(4)
    want = [pulse_sequences(b, 24, epoch=4, **arguments) for b in plain]
    assert_same_batches(want, first + list(resumed), torch)
    assert repr(resumed) == (f"shardify.sequences.SequenceLoader({resumed.loader!r}, 24, "
                             "keep='random', standardize='graphnet', seed=3, "
                             "padding='length')")
    # Pickled (Lightning's ddp_spawn sends its dataloaders so), the same grids, resumed.
    again = pickle.loads(pickle.dumps(SequenceLoader(loader(), 24, **arguments)))
    again.load_state_dict(state)
    assert_same_batches(want[3:], list(again), torch)


def test_sequence_loader_refuses_what_pulse_sequences_would_at_the_first_batch(train_dir,
                                                                              torch):
    from shardify.sequences import SequenceLoader

    def loader(**settings):
        return shardify.Loader(train_dir, device="cpu", **settings)

    refused = [
        (TypeError, "SequenceLoader takes no epoch", (16,), dict(epoch=2)),
        (TypeError, "unexpected keyword argument 'k'.*pulse_sequences's arguments", (16,),
         dict(k=8)),
        (ValueError, "length must be a positive integer, not 0", (0,), {}),
        (ValueError, "invalid keep: 'first'", (16,), dict(keep="first")),
        (ValueError, "invalid standardize: 'z'", (16,), dict(standardize="z")),
        (ValueError, "invalid padding: 'max'", (16,), dict(padding="max")),
        (ValueError, "pad_to_multiple_of must be a positive integer or None, not 0", (16,),
         dict(padding="longest", pad_to_multiple_of=0)),
        (ValueError, "pad_to_multiple_of rounds the longest event's length up; give it with "
         'padding="longest"', (16,), dict(pad_to_multiple_of=8)),
        (ValueError, "SequenceLoader needs a length .*: give it, or make the loader with "
         "group_by_length=LENGTH", (), {}),
    ]
    for error, message, length, arguments in refused:
        with pytest.raises(error, match=message):
            SequenceLoader(loader(), *length, **arguments)
    # Grouped without a cap, or by DOM count, the loader has no pulse length to take.
    for grouping in (dict(group_by_length=True), dict(group_by_length=8, length_of="doms")):
        with pytest.raises(ValueError, match="SequenceLoader needs a length"):
            SequenceLoader(loader(**grouping))
    with pytest.raises(TypeError, match='needs torch tensors: make the loader with output="'):
        SequenceLoader(loader(output="numpy"), 16)
    with pytest.raises(ValueError, match="needs packed batches with event_dom_offsets, "):
        SequenceLoader(loader(layout="padded", max_doms=4, pulses_per_dom=1), 16)


def test_its_defaults_keep_a_token_budgets_grids_within_it(train_dir, torch):
    from shardify.sequences import SequenceLoader
    from shardify.transforms import pulse_sequences

    def loader():
        return shardify.Loader(train_dir, group_by_length=64, **BUDGET)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sequences = SequenceLoader(loader(), standardize="graphnet")
    # The grouping's cap as the length, each batch padded to its longest event.
    assert (sequences.length, sequences.pulse_sequences_arguments["padding"]) == (64, "longest")
    grids = list(sequences)
    want = [pulse_sequences(b, 64, padding="longest", standardize="graphnet")
            for b in loader()]
    assert_same_batches(want, grids, torch)
    assert sorted(torch.cat([g["event_id"] for g in grids]).tolist()) == sorted(
        loader().dataset.event_ids().tolist())
    assert max(cells(grids)) <= BUDGET["max_tokens"]
    assert len({g["pulse_mask"].shape[1] for g in grids}) > 1  # padded to each longest
    # A budget that counts grids rounded up to a multiple: padded so, they keep within it
    # (test_it_warns_... shows the same rounding overrun a budget that did not count it).
    for multiple in (16, 24):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rounded = SequenceLoader(shardify.Loader(train_dir, group_by_length=64,
                                                     pad_to_multiple_of=multiple, **BUDGET))
        assert rounded.pulse_sequences_arguments["pad_to_multiple_of"] == multiple
        grids = list(rounded)
        widths = {g["pulse_mask"].shape[1] for g in grids}
        assert all(w % multiple == 0 or w == 64 for w in widths) and len(widths) > 1, widths
        assert max(cells(grids)) <= BUDGET["max_tokens"]
        assert sum(len(g["event_id"]) for g in grids) == 300


def test_it_warns_of_settings_that_break_a_token_budget_and_they_do(train_dir, torch):
    from shardify.sequences import SequenceLoader

    def sequences(loader_settings, *length, **arguments):
        loader = shardify.Loader(train_dir, **dict(BUDGET, **loader_settings))
        return SequenceLoader(loader, *length, **arguments)

    budget = BUDGET["max_tokens"]
    overruns = [
        (dict(group_by_length=64), (128,), {},
         "counts up to group_by_length=64 of each event's pulses, while the grids keep up to "
         "128: grids of up to 2x the budget; make the loader with group_by_length=128, or cut "
         "the sequences to 64"),
        (dict(group_by_length=64), (), dict(padding="length"),
         "padding='length' pads every batch to 64 pulses, while max_tokens=2048 counts each "
         "batch's longest event: batches of short events overrun the budget"),
        (dict(group_by_length=64), (), dict(pad_to_multiple_of=16),
         "pad_to_multiple_of=16 rounds each grid's length up past the longest event, which "
         "max_tokens=2048 counted: grids over the budget; make the loader with "
         "pad_to_multiple_of=16"),
        (dict(group_by_length=64, pad_to_multiple_of=12), (), dict(pad_to_multiple_of=16),
         "pad_to_multiple_of=16 rounds each grid's length up past the longest event rounded "
         "up to pad_to_multiple_of=12, which max_tokens=2048 counted"),
        (dict(max_tokens=None, max_pulses=2048, pulse_cap=64), (64,), dict(padding="longest"),
         "the loader's budget of max_pulses=2048 bounds a batch's pulses, not its padded grid"),
        (dict(group_by_length=64, length_of="doms"), (64,), {},
         "max_tokens=2048 counts DOM rows \\(length_of='doms'\\), while the grids hold pulses"),
        (dict(group_by_length=64, max_tokens=48), (), {},
         "max_tokens=48 is less than the 64 pulses the grids keep: an event longer than 48 "
         "pulses forms a batch alone, a grid of up to 64 cells, over the budget; make the "
         "loader with max_tokens of at least 64, or with group_by_length=48 and cut the "
         "sequences to 48"),
    ]
    for loader_settings, length, arguments, message in overruns:
        with pytest.warns(UserWarning, match=message) as said:
            made = sequences(loader_settings, *length, **arguments)
        assert len(said) == 1 and said[0].filename == __file__
        limit = dict(BUDGET, **loader_settings)["max_tokens"] or budget
        assert max(cells(made)) > limit, message  # the grids really overran it
    # Counting more pulses than the grids keep: more steps than the budget needs.
    # (what the loader counts, what the grids hold, the loader that counts what they hold)
    fewer = [
        (dict(group_by_length=64), (32,), dict(group_by_length=32),
         "counts up to group_by_length=64 of each event's pulses, while the grids keep at most "
         "32: batches of fewer events than fit, more steps; make the loader with "
         "group_by_length=32"),
        (dict(group_by_length=True), (64,), dict(group_by_length=64),
         "counts all of each event's pulses, while the grids keep at most 64: .* make the "
         "loader with group_by_length=64"),
        (dict(group_by_length=64, pad_to_multiple_of=48), (64,),
         dict(group_by_length=64, pad_to_multiple_of=8),
         "counts the longest event rounded up to pad_to_multiple_of=48, while the grids are "
         "padded to a multiple of 8: batches of fewer events than fit, more steps; make the "
         "loader with pad_to_multiple_of=8"),
    ]
    for loader_settings, length, fixed_settings, message in fewer:
        padded_to = dict(pad_to_multiple_of=8) if "pad_to_multiple_of" in loader_settings else {}
        with pytest.warns(UserWarning, match=message):
            made = sequences(loader_settings, *length, **padded_to)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fixed = sequences(fixed_settings, *length, **padded_to)
        assert max(cells(made)) <= budget and max(cells(fixed)) <= budget, message
        assert len(made) > len(fixed), message
    # Without a budget, grouped by fewer pulses than the grids keep: more padding.
    settings = dict(batch_events=32, block_events=32, window_blocks=8, device="cpu")

    def fill(grids):
        return sum(int(g["event_pulses"].sum()) for g in grids) / sum(cells(grids))

    with pytest.warns(UserWarning, match="groups events by up to group_by_length=32 of their "
                      "pulses, while the grids keep up to 128: a batch of its longest class "
                      "holds events of 32 to 128 pulses, padded to the longest; make the "
                      "loader with group_by_length=128"):
        coarse = SequenceLoader(shardify.Loader(train_dir, group_by_length=32, **settings), 128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fine = SequenceLoader(shardify.Loader(train_dir, group_by_length=128, **settings))
        assert fill(list(coarse)) < fill(list(fine)) - 0.05
        # Grouped by the grids' length or more, or padded to one length: nothing said.
        SequenceLoader(shardify.Loader(train_dir, group_by_length=64, device="cpu"), 32,
                       padding="longest", pad_to_multiple_of=16)
        SequenceLoader(shardify.Loader(train_dir, group_by_length=16, device="cpu"), 32,
                       padding="length")
        SequenceLoader(shardify.Loader(train_dir, device="cpu"), 16)
