"""The training examples run, checkpoint and resume exactly (examples/checkpoints.py)."""

import subprocess
import sys

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


def test_train_dynedge_example_trains_checkpoints_and_resumes(train_dir, torch, tmp_path):
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    script = REPO / "examples" / "train_dynedge.py"
    ckpt = tmp_path / "dyn.pt"
    common = [sys.executable, str(script), str(train_dir), "--batch-events", "32",
              "--width", "0.05", "--max-pulses", "64", "--checkpoint", str(ckpt)]
    first = subprocess.run(common + ["--stop-after", "3"], capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    assert "3 steps, 96 events" in first.stdout
    assert "adapter share of a step" in first.stdout and "waiting for data" in first.stdout
    # The warm-up (3 steps by default) leaves at least one step to the steady state.
    assert "warm-up (the first 2 steps)" in first.stdout
    assert "steady state (1 steps)" in first.stdout
    saved = torch.load(ckpt)
    assert saved["loader"]["batches_taken"] == 3 and "model" in saved and "optimiser" in saved
    rest = subprocess.run(common + ["--resume"], capture_output=True, text=True, timeout=300)
    assert rest.returncode == 0, rest.stderr
    assert "resumed at epoch 0, batch 3" in rest.stdout
    # The resumed run trains exactly the rest of the epoch.
    batches = len(shardify.Loader(train_dir, batch_events=32))
    assert f"{batches - 3} steps" in rest.stdout


def test_train_lightning_example_resumes_and_runs_ddp(train_dir, torch, lightning, tmp_path):
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
    # Lightning's DDP on 2 CPU processes: each rank its half of the complete batches.
    ddp = run("train_lightning.py", *common[:-2], "--checkpoint-dir", str(tmp_path / "ddp"),
              "--devices", "2")
    per_rank = train_events // 64 * 32
    assert f"rank 0: {per_rank} events" in ddp and f"rank 1: {per_rank} events" in ddp
