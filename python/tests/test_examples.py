"""The training examples run, checkpoint and resume exactly (examples/checkpoints.py)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import shardify
from conftest import REPO


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "examples" / script), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_train_torch_example_trains_checkpoints_and_resumes(train_dir, torch, tmp_path):
    ckpt = tmp_path / "torch.pt"
    common = [str(train_dir), "--batch-events", "32", "--max-doms", "16",
              "--pulses-per-dom", "2", "--checkpoint", str(ckpt)]
    first = run("train_torch.py", *common, "--stop-after", "2")
    assert "2 steps, 64 events" in first
    assert torch.load(ckpt)["loader"]["batches_taken"] == 2
    rest = run("train_torch.py", *common, "--resume")
    assert "resumed at epoch 0, batch 2" in rest
    assert f"{len(shardify.Loader(train_dir, batch_events=32)) - 2} steps" in rest


def test_predict_example_writes_the_same_file_from_batches_of_similar_dom_count(
        train_dir, torch, tmp_path):
    """Inference grouped by DOM count within a budget of DOM rows predicts what batches of a
    fixed count predict: each event once, its prediction independent of its batch."""
    pq = pytest.importorskip("pyarrow.parquet")
    ckpt = tmp_path / "torch.pt"
    shape = ["--max-doms", "16", "--pulses-per-dom", "2"]
    run("train_torch.py", str(train_dir), "--batch-events", "32", *shape, "--checkpoint",
        str(ckpt), "--stop-after", "2")
    tables = []
    for batching in (["--batch-events", "32"], ["--max-tokens", "256"]):
        out = tmp_path / f"submission{len(tables)}.parquet"
        done = run("predict.py", str(train_dir), str(out), "--checkpoint", str(ckpt), *shape,
                   "--device", "cpu", *batching)
        assert "300 events from 1 rank(s)" in done
        tables.append(pq.read_table(out).to_pydict())
    fixed, grouped = tables
    assert fixed["event_id"] == grouped["event_id"] == sorted(fixed["event_id"])
    for column in ("azimuth", "zenith"):
        assert torch.allclose(torch.tensor(fixed[column]), torch.tensor(grouped[column]),
                              rtol=0, atol=1e-9), column
    # Grouped by DOM count, the batches are not those of 32 events.
    loader = shardify.Loader(train_dir, max_tokens=256, group_by_length=16, length_of="doms",
                             layout="padded", max_doms=16, pulses_per_dom=2, shuffle=False,
                             output="numpy")
    grids = [batch["dom_mask"].size for batch in loader]
    assert max(grids) <= 256 and len(grids) != 300 // 32 + 1


@pytest.mark.parametrize("script, sizes, adapter", [
    ("train_dynedge.py", ["--width", "0.05"], "to_pyg"),
    ("train_transformer.py", ["--width", "16", "--heads", "2", "--layers", "1"],
     "pulse_sequences"),
    ("train_transformer.py", ["--width", "16", "--heads", "2", "--layers", "1",
                              "--group-by-length"], "pulse_sequences"),
])
def test_adapted_training_example_trains_checkpoints_and_resumes(train_dir, torch, tmp_path,
                                                                 script, sizes, adapter):
    """The examples that adapt each batch on its device (examples/adapted_training.py):
    their timing report, warm-up apart; a checkpoint at the stop; a resumed run trains
    exactly the rest of the epoch."""
    if script == "train_dynedge.py":
        pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    ckpt = tmp_path / "model.pt"
    common = [str(train_dir), "--batch-events", "32", *sizes, "--max-pulses", "64",
              "--checkpoint", str(ckpt)]
    first = run(script, *common, "--stop-after", "3")
    assert "3 steps, 96 events" in first
    assert f"adapter ({adapter})" in first and "adapter share of a step" in first
    assert "waiting for data" in first
    # The warm-up (3 steps by default) leaves at least one step to the steady state.
    assert "warm-up (the first 2 steps)" in first
    assert "steady state (1 steps)" in first
    assert re.search(r"epoch 0: mean loss \d\.\d{4} ", first), first
    saved = torch.load(ckpt)
    assert saved["loader"]["batches_taken"] == 3 and "model" in saved and "optimiser" in saved
    rest = run(script, *common, "--resume")
    assert "resumed at epoch 0, batch 3" in rest
    # The resumed run trains exactly the rest of the epoch.
    batches = len(shardify.Loader(train_dir, batch_events=32))
    assert f"{batches - 3} steps, " in rest


def test_transformer_example_pads_batches_grouped_by_length_less(train_dir, torch, tmp_path):
    common = [str(train_dir), "--batch-events", "32", "--width", "16", "--heads", "2",
              "--layers", "1", "--max-pulses", "64", "--checkpoint", str(tmp_path / "m.pt")]
    fills = {}
    for flags in ([], ["--group-by-length"]):
        out = run("train_transformer.py", *common, *flags)
        found = re.search(r"padding: ([\d.]+)% of the grids' cells hold pulses", out)
        assert found, out
        fills[bool(flags)] = float(found.group(1))
    assert "each padded to its longest (a multiple of 16, at most 64)" in out
    assert fills[True] > fills[False] + 15, fills
    # Cut by a budget of 512 padded tokens: every grid within it, as full as grouped ones.
    out = run("train_transformer.py", *common, "--group-by-length", "--max-tokens", "512")
    assert ("batches of similar length within 512 padded tokens, each padded to its longest "
            "(a multiple of 16, at most 64)") in out
    found = re.search(r"padding: ([\d.]+)% of the grids' cells hold pulses; the largest grid "
                      r"(\d+) cells", out)
    assert found, out
    assert float(found.group(1)) > fills[False] + 15 and int(found.group(2)) <= 512, out
    batches = len(shardify.Loader(train_dir, max_tokens=512, group_by_length=64,
                                  pad_to_multiple_of=16))
    assert f"300 events, {batches} batches per epoch" in out


def test_train_lightning_example_resumes_and_runs_ddp(train_dir, torch, lightning, tmp_path,
                                                      monkeypatch):
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    common = [str(train_dir), "--batch-events", "32", "--width", "0.05", "--max-pulses", "64",
              "--val-fraction", "0.2", "--accelerator", "cpu", "--checkpoint-every", "1",
              "--checkpoint-dir", str(tmp_path / "ckpt")]
    train_events = len(shardify.Dataset(train_dir).split(0.2, seed=0)[0])
    first = run("train_lightning.py", *common, "--stop-after", "3")
    assert "stopped after 3 steps, 96 events" in first
    rest = run("train_lightning.py", *common, "--resume")
    assert "resumed from epoch=0-step=3.ckpt (step 3)" in rest
    # The rest of the epoch, exactly: its events less the 96 trained before the stop.
    assert f"rank 0: {train_events - 96} events trained in this run" in rest
    assert "epoch 0: train_loss" in rest and "val_loss" in rest
    # Lightning's DDP on 2 CPU processes, batches by a budget of nodes (the loss event_mean):
    # each rank exactly its share, and the ranks' shares unequal in events.
    ddp = run("train_lightning.py", *common[:-2], "--checkpoint-dir", str(tmp_path / "ddp"),
              "--devices", "2", "--pulse-budget", "1500")
    train = shardify.Dataset(train_dir).split(0.2, seed=0)[0]
    shares = [sum(len(batch["event_id"]) for batch in shardify.Loader(
        train, max_pulses=1500, pulse_cap=64, rank=rank, world=2, device="cpu",
        output="numpy"))
        for rank in (0, 1)]
    assert shares[0] != shares[1] and sum(shares) > train_events * 0.8, shares
    for rank, share in enumerate(shares):
        assert f"rank {rank}: {share} events trained in this run" in ddp, ddp
    # The validation's 60 events split 32 / 28 over the ranks: its loss is the mean over
    # the 60, as one process computes it with the weights validated (the last step's
    # checkpoint), not the mean of the ranks' means.
    logged = re.search(r"epoch 0: train_loss [\d.]+, val_loss ([\d.]+)", ddp)
    assert logged, ddp
    exact = validation_loss(tmp_path / "ddp", train_dir, monkeypatch, torch)
    assert abs(float(logged.group(1)) - exact) < 2e-6, (logged.group(0), exact)


def validation_loss(checkpoints: Path, train_dir: Path, monkeypatch, torch) -> float:
    """train_lightning.py's validation loss over all of its events in one process, with
    the weights of the latest checkpoint in ``checkpoints``."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import train_lightning
    from shardify.torch_geometric import GraphLoader

    saved = torch.load(train_lightning.latest_checkpoint(checkpoints), map_location="cpu",
                       weights_only=False)
    model = train_lightning.DirectionModel(**saved["hyper_parameters"])
    model.load_state_dict(saved["state_dict"])
    model.eval()
    val = shardify.Dataset(train_dir).split(0.2, seed=0)[1]
    graphs = GraphLoader(shardify.Loader(val, batch_events=32, shuffle=False, device="cpu"),
                         standardize="graphnet", knn=8, max_pulses=64)
    with torch.no_grad():
        errors = torch.cat([model.errors(batch) for batch in graphs])
    assert len(errors) == len(val) == 60
    return float(errors.double().mean())


def test_the_transformer_example_gives_an_event_without_pulses_a_finite_direction(
        torch, monkeypatch):
    """A row whose mask is all False (an event without pulses) would mask every key; the
    model keeps one slot visible, so no NaN reaches the batch's loss on torch before 2.5,
    whose attention over no key is NaN (from 2.5 it is zeros, and this passes either way)."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import train_transformer

    torch.manual_seed(0)
    model = train_transformer.PulseTransformer(width=16, heads=2, layers=1)
    features = torch.randn(3, 5, 6)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False], [False] * 5])
    out = model(features, mask)
    assert out.shape == (3, 3) and torch.isfinite(out).all(), out
    assert torch.allclose(out.norm(dim=1), torch.ones(3), atol=1e-5)
    # The padding does not change an event's direction: the same pulses without it.
    alone = model(features[1:2, :2], mask[1:2, :2])
    assert torch.allclose(out[1], alone[0], atol=1e-5), (out[1], alone[0])
