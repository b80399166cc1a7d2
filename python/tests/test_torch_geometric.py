"""The PyG adapter: nodes, features and the per-node batch vector against the packed batch."""

import numpy as np
import pytest
import shardify
from conftest import assert_same_batches

pyg = pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")


@pytest.mark.parametrize("nodes", ["pulses", "doms"])
def test_to_pyg_matches_the_packed_batch(train_dir, stored, torch, nodes):
    from shardify.torch_geometric import to_pyg

    for batch in shardify.Loader(train_dir, batch_events=16):
        graphs = to_pyg(batch, nodes=nodes)
        assert isinstance(graphs, pyg.data.Batch)
        assert graphs.num_graphs == len(batch["event_id"])
        np.testing.assert_array_equal(graphs.event_id.numpy(), batch["event_id"].numpy())
        for g, event_id in enumerate(batch["event_id"].tolist()):
            want = stored.event(event_id)
            rows = (graphs.batch == g).nonzero().flatten().numpy()
            assert rows.tolist() == list(range(graphs.ptr[g], graphs.ptr[g + 1]))
            x = graphs.x[rows].numpy()
            xyz = stored.positions[want["dom_sensor_id"]].astype(np.float32)
            if nodes == "pulses":
                assert len(rows) == len(want["pulse_time"])
                # Time order, ties in stored order.
                order = np.argsort(want["pulse_time"], kind="stable")
                np.testing.assert_array_equal(
                    x[:, :3], np.repeat(xyz, want["dom_pulse_counts"], 0)[order])
                for column, name in enumerate(["pulse_time", "pulse_charge", "pulse_auxiliary"]):
                    np.testing.assert_array_equal(x[:, 3 + column],
                                                  want[name][order].astype(np.float32))
            else:
                assert len(rows) == len(want["dom_sensor_id"])
                np.testing.assert_array_equal(x[:, :3], xyz)
                np.testing.assert_array_equal(x[:, 3], want["dom_pulse_counts"])
                starts = np.concatenate([[0], np.cumsum(want["dom_pulse_counts"])[:-1]])
                first_times = want["pulse_time"][starts].astype(np.float32)
                np.testing.assert_array_equal(x[:, 4], first_times)
                sums = np.add.reduceat(want["pulse_charge"].astype(np.float32), starts)
                np.testing.assert_allclose(x[:, 5], sums, rtol=1e-6)
                weighted = np.add.reduceat(want["pulse_time"].astype(np.float32)
                                           * want["pulse_charge"].astype(np.float32), starts)
                np.testing.assert_allclose(x[:, 6], weighted / sums, rtol=1e-5)
                anyaux = np.maximum.reduceat(want["pulse_auxiliary"].astype(np.float32), starts)
                np.testing.assert_array_equal(x[:, 7], anyaux)
            assert graphs.y[g].tolist() == [want["event_azimuth"], want["event_zenith"]]


def fields(graphs):
    """PyG batches as the dicts of their fields, for ``assert_same_batches``."""
    return [g.to_dict() for g in graphs]


def test_graph_loader_is_its_loader_through_to_pyg(train_dir, torch):
    from shardify.torch_geometric import GraphLoader, to_pyg

    def loader():
        return shardify.Loader(train_dir, batch_events=32, seed=5, device="cpu")

    arguments = dict(standardize="graphnet", knn=4, max_pulses=12, keep="random", seed=3)
    graphs = GraphLoader(loader(), **arguments)
    plain = loader()
    assert len(graphs) == len(plain) and graphs.sampler is graphs.loader.sampler
    assert graphs.dataset is graphs.loader.dataset
    for epoch in (0, 1):  # keep="random" draws with the loader's epoch: epochs differ
        want = [to_pyg(b, epoch=epoch, **arguments) for b in plain]
        got = list(graphs)
        assert graphs.epoch == plain.epoch == epoch + 1
        assert_same_batches(fields(want), fields(got), torch)
    # State, set_epoch and len are the loader's; a state resumes mid-epoch.
    graphs.set_epoch(4)
    first = [g for _, g in zip(range(3), graphs, strict=False)]
    state = graphs.state_dict()
    assert (state["epoch"], state["global_batches"]) == (4, 3)
    resumed = GraphLoader(loader(), **arguments)
    resumed.load_state_dict(state)
    plain.set_epoch(4)
    want = [to_pyg(b, epoch=4, **arguments) for b in plain]
    assert_same_batches(fields(want), fields(first + list(resumed)), torch)
    with pytest.raises(TypeError, match="GraphLoader takes no epoch"):
        GraphLoader(loader(), epoch=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'k'.*to_pyg's arguments"):
        GraphLoader(loader(), k=8)
    # Loaders whose batches to_pyg cannot take are refused before any training starts.
    with pytest.raises(TypeError, match='needs torch tensors: make the loader with output="'):
        GraphLoader(shardify.Loader(train_dir, output="numpy"))
    padded = shardify.Loader(train_dir, layout="padded", max_doms=4, pulses_per_dom=1)
    no_positions = shardify.Loader(train_dir, dom_positions=False)
    with pytest.raises(ValueError, match="needs packed batches with event_dom_offsets, "):
        GraphLoader(padded)
    with pytest.raises(ValueError, match="needs packed batches with dom_position: make"):
        GraphLoader(no_positions)



def test_graph_loader_warns_of_a_pulse_budget_that_counts_other_pulses_than_its_nodes(
        train_dir, torch):
    import warnings

    from shardify.torch_geometric import GraphLoader

    def graphs(budget, **to_pyg_arguments):
        return GraphLoader(shardify.Loader(train_dir, device="cpu", **budget), knn=4,
                           **to_pyg_arguments)

    warned = [
        (dict(max_pulses=2000), dict(max_pulses=64),
         "budget of max_pulses=2000 counts all of each event's pulses, while its graphs keep "
         "at most max_pulses=64 pulses an event: batches of fewer nodes than the budget; make "
         "the loader with pulse_cap=64"),
        (dict(max_pulses=2000, pulse_cap=80), dict(max_pulses=64), "of fewer nodes"),
        (dict(max_pulses=2000, pulse_cap=32), dict(max_pulses=64),
         "counts up to pulse_cap=32 of each event's pulses, .* batches of more nodes than the "
         "budget; make the loader with pulse_cap=64"),
        (dict(max_pulses=2000, pulse_cap=64), {},
         "keep all their pulses: batches of more nodes than the budget; give GraphLoader "
         "max_pulses=64, or make the loader without pulse_cap"),
    ]
    for budget, to_pyg_arguments, message in warned:
        with pytest.warns(UserWarning, match=message):
            graphs(budget, **to_pyg_arguments)
    # Counting what the graphs keep, by DOM nodes, or without a pulse budget: nothing said.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graphs(dict(max_pulses=2000, pulse_cap=64), max_pulses=64)
        graphs(dict(max_pulses=2000), nodes="doms")
        graphs(dict(batch_events=8), max_pulses=64)
