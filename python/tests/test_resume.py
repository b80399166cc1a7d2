"""state_dict / load_state_dict: resume exactly after the last batch handed out."""

import pytest
import shardify
from conftest import FIXTURES, ids, order_lines, run_cli, take


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


def test_a_for_after_the_last_batch_handed_out_starts_the_next_epoch(train_dir, torch):
    # PyTorch Lightning takes len(loader) batches and never asks for the epoch's end.
    flags = ["--max-pulses", "900", "--max-events", "40"]
    epoch0, epoch1 = (order_lines(train_dir, *flags, "--epoch", e) for e in ("0", "1"))
    assert len(epoch0) != len(epoch1), "a pulse budget: the epochs' batch counts differ"
    loader = shardify.Loader(train_dir, max_pulses=900, max_events=40, device="cpu")
    assert len(loader) == len(epoch0)
    taken = take(loader, len(epoch0))
    assert taken == epoch0
    state = loader.state_dict()  # as saved inside the loop, after its last batch
    assert (state["epoch"], state["global_batches"]) == (0, len(epoch0))
    assert (loader.epoch, len(loader)) == (1, len(epoch1))
    assert ids(loader) == epoch1 and loader.epoch == 2
    # That state loaded: the (empty) rest of epoch 0 first, as torchdata's
    # StatefulDataLoader gives, then epoch 1.
    resumed = shardify.Loader(train_dir, max_pulses=900, max_events=40, device="cpu")
    resumed.load_state_dict(state)
    assert resumed.epoch == 0 and ids(resumed) == [] and ids(resumed) == epoch1


def test_an_epoch_left_short_at_the_first_len_is_warned_of_once(train_dir):
    """A loop that reads len() once and takes that many batches of every epoch (as PyTorch
    Lightning does unless it reloads its dataloaders) leaves a budget's longer epoch short:
    the iterator let go of there (or else the next set_epoch) warns, once, with the counts,
    also when it is the loop's last epoch. A stop at another count (a break,
    limit_train_batches) or at the epoch's own count is not warned of."""
    import warnings

    def loop(loader, epochs, stop_after=None):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            n = len(loader) if stop_after is None else stop_after
            taken = []
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                # range first: zip stops without asking the loader for one more.
                taken.append(sum(1 for _, _ in zip(range(n), loader, strict=False)))
        return taken, [str(w.message) for w in caught]

    settings = dict(max_pulses=500, device="cpu", output="numpy")
    counts = [shardify.Loader(train_dir, **settings)._batch_count(e, 0) for e in range(4)]
    assert counts == [37, 39, 37, 39], counts  # the case at hand: epochs 1 and 3 longer
    warning = (
        "Loader: epoch 1 was left after 37 of its 39 batches, the count len() gave for epoch "
        "0: its last 2 were not trained. Under a pulse or token budget each epoch has its own "
        "number of batches, and PyTorch Lightning keeps the len() it read at its start as "
        "every epoch's limit unless it reloads its dataloaders (as would a loop that reads "
        "len() once): give the Trainer (or GraphNeT's fit) "
        "reload_dataloaders_every_n_epochs=1. (Warned once per loader.)")
    assert loop(shardify.Loader(train_dir, **settings), 4) == ([37] * 4, [warning])
    # Epoch 1 the last: no set_epoch follows, the iterator's end warns the same.
    assert loop(shardify.Loader(train_dir, **settings), 2) == ([37] * 2, [warning])
    assert loop(shardify.Loader(train_dir, **settings), 4, stop_after=10)[1] == []
    # Epochs of one count (a fixed batch size): whole, nothing to warn of.
    assert loop(shardify.Loader(train_dir, batch_events=8, device="cpu", output="numpy"),
                3) == ([38] * 3, [])


def test_set_epoch_keeps_a_position_just_loaded_in_its_epoch(train_dir, torch):
    full = order_lines(train_dir, "--batch-events", "8", "--epoch", "2")
    loader = shardify.Loader(train_dir, batch_events=8, device="cpu")
    loader.sampler.set_epoch(2)  # where Lightning calls it: the loader's set_epoch
    first = take(loader, 5)
    state = loader.state_dict()
    resumed = shardify.Loader(train_dir, batch_events=8, device="cpu")
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(2)  # as a loop calls it at every epoch's top, as DDP asks
    assert len(resumed) == len(full), "counted from the epoch's start, as a DataLoader's"
    assert first + ids(resumed) == full
    resumed.set_epoch(2)  # batches were handed out since the load: epoch 2 from its start
    assert ids(resumed) == full
    other = shardify.Loader(train_dir, batch_events=8, device="cpu")
    other.load_state_dict(state)
    other.set_epoch(1)  # another epoch than the state's: its start
    assert ids(other) == order_lines(train_dir, "--batch-events", "8", "--epoch", "1")


def test_the_same_loop_continues_after_break(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=8)
    first = []
    for batch in loader:
        first.append(batch["event_id"].tolist())
        if len(first) == 5:
            break
    assert first + ids(loader) == order_lines(train_dir, "--batch-events", "8")


@pytest.mark.parametrize("kwargs", [
    {"output": "numpy"}, {"device": "cpu"}, {"device": "cpu", "resident": True},
], ids=["numpy", "torch", "resident"])
def test_a_newer_iterator_takes_the_loader_over(train_dir, kwargs, request):
    if kwargs != {"output": "numpy"}:
        request.getfixturevalue("torch")
    full = order_lines(train_dir, "--batch-events", "8")
    loader = shardify.Loader(train_dir, batch_events=8, **kwargs)
    older = iter(loader)
    peeked = next(older)["event_id"].tolist()  # as a script peeks at a batch's shapes
    newer = iter(loader)
    rest = [batch["event_id"].tolist() for batch in newer]
    assert [peeked] + rest == full, "the newer one goes on from the loader's position"
    # The older one would now take epoch 1's batches, yielding more than len(loader).
    with pytest.raises(RuntimeError, match=r"iterated again .* make two loaders"):
        next(older)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batches_taken"] == 0
    assert ids(loader) == order_lines(train_dir, "--batch-events", "8", "--epoch", "1")
    # Interleaved, as zip(loader, loader) would: the older one fails before a batch.
    first, second = iter(loader), iter(loader)
    with pytest.raises(RuntimeError, match="iterated again"):
        next(first)
    assert next(second)["event_id"].tolist() == order_lines(
        train_dir, "--batch-events", "8", "--epoch", "2")[0]


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
    ("group_by_length", {"group_by_length": 100}),
    ("group_by_length", {"group_by_length": True, "length_of": "doms"}),
    ("batching", {"max_tokens": 600, "group_by_length": 60}),
    ("batching", {"max_pulses": 500, "pulse_cap": 30}),
])
def test_a_state_from_other_settings_is_refused(train_dir, torch, field, other):
    state = shardify.Loader(train_dir, batch_events=8).state_dict()
    loader = shardify.Loader(train_dir, **{"batch_events": 8, **other})
    with pytest.raises(ValueError, match=field):
        loader.load_state_dict(state)


def test_a_state_saved_before_length_grouping_and_token_budgets_resumes(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=8, device="cpu")
    first = take(loader, 3)
    state = loader.state_dict()
    for key in ("group_by_length", "length_of", "max_tokens", "pulse_cap", "pad_to_multiple_of"):
        del state["sampler"][key]  # as a checkpoint of an older shardify holds it
    resumed = shardify.Loader(train_dir, batch_events=8, device="cpu")
    resumed.load_state_dict(state)
    assert first + ids(resumed) == order_lines(train_dir, "--batch-events", "8")
    grouped = shardify.Loader(train_dir, batch_events=8, group_by_length=True, device="cpu")
    with pytest.raises(ValueError, match="invalid group_by_length: the saved state has off"):
        grouped.load_state_dict(state)


def test_a_pulse_capped_state_resumes_and_another_cap_is_refused(train_dir, torch):
    settings = dict(max_pulses=500, pulse_cap=30)
    loader = shardify.Loader(train_dir, device="cpu", **settings)
    first = take(loader, 3)
    state = loader.state_dict()
    assert state["sampler"]["pulse_cap"] == 30
    resumed = shardify.Loader(train_dir, device="cpu", **settings)
    resumed.load_state_dict(state)
    assert first + ids(resumed) == order_lines(train_dir, "--max-pulses", "500",
                                               "--pulse-cap", "30")
    for other, ours in ((None, "max_pulses 500"), (31, "max_pulses 500, pulse_cap 31")):
        loader = shardify.Loader(train_dir, device="cpu", max_pulses=500, pulse_cap=other)
        with pytest.raises(ValueError, match="invalid batching: the saved state has max_pulses "
                                             f"500, pulse_cap 30, this loader {ours}$"):
            loader.load_state_dict(state)


def test_a_rounded_token_budget_is_the_orders_and_resumes_only_rounded_alike(train_dir, torch):
    settings = dict(max_tokens=2048, group_by_length=64, max_events=64, block_events=32,
                    window_blocks=8, device="cpu")
    flags = ("--max-tokens", "2048", "--group-by-length", "64", "--max-events", "64",
             "--block-events", "32", "--window", "8")
    loader = shardify.Loader(train_dir, pad_to_multiple_of=24, **settings)
    first = take(loader, 3)
    state = loader.state_dict()
    assert state["sampler"]["pad_to_multiple_of"] == 24
    resumed = shardify.Loader(train_dir, pad_to_multiple_of=24, **settings)
    resumed.load_state_dict(state)
    rounded = order_lines(train_dir, *flags, "--pad-to-multiple-of", "24")
    assert first + ids(resumed) == rounded
    # Rounding changes the cut: the budget counts wider grids, so batches hold fewer events.
    assert rounded != order_lines(train_dir, *flags)
    for other, ours in ((None, ""), (16, ", pad_to_multiple_of 16")):
        loader = shardify.Loader(train_dir, pad_to_multiple_of=other, **settings)
        with pytest.raises(ValueError, match="invalid batching: the saved state has max_tokens "
                                             "2048, max_events 64, pad_to_multiple_of 24, this "
                                             f"loader max_tokens 2048, max_events 64{ours}$"):
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


def test_the_sampler_frameworks_look_for(train_dir, torch):
    from torch.utils.data import Sampler, SequentialSampler

    shuffled = shardify.Loader(train_dir, device="cpu")
    assert isinstance(shuffled.sampler, Sampler)
    assert not isinstance(shuffled.sampler, SequentialSampler)
    assert shuffled.sampler is shuffled.sampler and len(shuffled.sampler) == 300
    with pytest.raises(TypeError, match="draws its own order: iterate the loader"):
        iter(shuffled.sampler)
    # Without shuffle a SequentialSampler (GraphNeT's predict_as_dataframe asks for one):
    # the stored order, which the loader delivers.
    stored = shardify.Loader(train_dir, batch_events=64, shuffle=False, output="numpy")
    assert isinstance(stored.sampler, SequentialSampler)
    assert list(stored.sampler) == list(range(300))
    events = shardify.Dataset(train_dir).event_ids().tolist()
    assert [e for batch in ids(stored) for e in batch] == events


@pytest.mark.parametrize("group_by_length, length_of, max_tokens", [
    (True, "pulses", None), (60, "pulses", None), (12, "doms", None), (60, "pulses", 600),
    (12, "doms", 96)])
def test_a_length_grouped_epoch_resumes_at_another_world_size(train_dir, torch,
                                                               group_by_length, length_of,
                                                               max_tokens):
    batching, batching_flags = (
        (dict(batch_events=8), ["--batch-events", "8"]) if max_tokens is None
        else (dict(max_tokens=max_tokens), ["--max-tokens", str(max_tokens)]))
    flags = batching_flags + ["--length-of", length_of, "--group-by-length"] + (
        [] if group_by_length is True else [str(group_by_length)])
    full = order_lines(train_dir, *flags, "--epoch", "1")
    grouping = dict(group_by_length=group_by_length, length_of=length_of, **batching)
    loader = shardify.Loader(train_dir, device="cpu", **grouping)
    loader.set_epoch(1)
    first = take(loader, 9)
    state = loader.state_dict()
    assert state["sampler"]["group_by_length"] == group_by_length
    assert state["sampler"]["length_of"] == length_of
    assert state["sampler"]["max_tokens"] == max_tokens
    ranks = []
    for rank in range(2):
        resumed = shardify.Loader(train_dir, rank=rank, world=2,
                                  drop_last=False, device="cpu", **grouping)
        resumed.load_state_dict(state)
        ranks.append(ids(resumed))
    # Dealt round-robin from the saved position: rank 0, rank 1, rank 0, ...
    rest = [batch for pair in zip(*ranks, strict=False) for batch in pair]
    rest += ranks[0][len(ranks[1]):]
    assert first + rest == full
    plain = shardify.Loader(train_dir, batch_events=8, device="cpu")
    refusal = ("invalid group_by_length: the saved state has " if max_tokens is None else
               f"invalid batching: the saved state has max_tokens {max_tokens}, this loader "
               f"batch_events 8")
    with pytest.raises(ValueError, match=refusal):
        plain.load_state_dict(state)
