"""Datasets and loaders pickle (spawned processes, Ray): unpickled, a dataset is the same
events (or refuses to be, when its directory changed) and a loader goes on where it stood."""

import pickle
import subprocess
import sys

import pytest
import shardify
from conftest import FIXTURES, ids, run_cli


def same_dataset(a: shardify.Dataset, b: shardify.Dataset) -> None:
    assert (b.identity, b.path, b.whole, len(b), b.pulses) == (
        a.identity, a.path, a.whole, len(a), a.pulses)


def test_a_dataset_and_its_splits_pickle(train_dir):
    dataset = shardify.Dataset(train_dir)
    rest, chosen = dataset.split(0.25, 3)
    inner, _ = chosen.split(0.5, 1)
    for original in (dataset, rest, chosen, inner):
        same_dataset(original, pickle.loads(pickle.dumps(original)))
    assert len({d.identity for d in (dataset, rest, chosen, inner)}) == 4


def test_a_pickled_loader_goes_on_where_it_stood_in_another_process(train_dir, tmp_path):
    def mid_epoch() -> shardify.Loader:
        train, _ = shardify.Dataset(train_dir).split(0.1, 0)
        loader = shardify.Loader(train, output="numpy", batch_events=8, seed=5, window_blocks=2)
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        return loader

    expected = ids(mid_epoch())
    assert expected
    pickled = tmp_path / "loader.pickle"
    pickled.write_bytes(pickle.dumps(mid_epoch()))
    child = ("import pickle, sys, numpy; loader = pickle.load(open(sys.argv[1], 'rb')); "
             "print(loader.state_dict()['global_batches']); "
             "[print(*numpy.asarray(b['event_id']).tolist()) for b in loader]")
    done = subprocess.run([sys.executable, "-c", child, str(pickled)], capture_output=True,
                          text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "3"
    assert [[int(x) for x in line.split()] for line in lines[1:]] == expected


def test_a_resident_loader_pickles(train_dir, torch):
    loader = shardify.Loader(train_dir, batch_events=16, resident=True, device="cpu")
    next(iter(loader))
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.resident and copy.device == torch.device("cpu")
    assert ids(copy) == ids(loader)


def test_a_dataset_whose_directory_changed_is_refused(tmp_path):
    out = tmp_path / "ds"
    run_cli("convert", str(FIXTURES), str(out), "--split", "train", "--seed", "1")
    pickled = pickle.dumps(shardify.Dataset(out))
    for name in [p.name for p in out.iterdir()]:
        (out / name).unlink()
    out.rmdir()
    run_cli("convert", str(FIXTURES), str(out), "--split", "train", "--seed", "2")
    with pytest.raises(shardify.DatasetError, match="changed since this Dataset was pickled"):
        pickle.loads(pickled)


def test_a_loader_given_its_rank_keeps_it(train_dir):
    loader = shardify.Loader(train_dir, output="numpy", batch_events=8, rank=1, world=2)
    copy = pickle.loads(pickle.dumps(loader))
    assert (copy.rank, copy.world, copy.drop_last) == (1, 2, True)
    assert ids(copy) == ids(loader)
