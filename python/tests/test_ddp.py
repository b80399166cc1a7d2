"""Real jobs under torchrun (gloo, CPU): DDP training with rank and world from
torch.distributed (batches of a fixed count, or by a token budget with a loss that weighs
every event of a step the same), preemption by SIGTERM with an elastic resume, and a
distributed prediction pass. The collectives time out, so a hang fails the test instead of CI."""

import importlib
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import IN_CI, REPO, order_lines

EXAMPLES = REPO / "examples"
#: What train_ddp.py's loader uses besides its defaults (see the example).
BATCH = 8


def torchrun(nproc: int, script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(EXAMPLES / script), *args]


def run(command: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr[-6000:]}"
    return done


def records(directory: Path, world: int) -> list[list[list[int]]]:
    """Each rank's trained batches (event ids), in order."""
    out = []
    for rank in range(world):
        path = directory / f"rank-{rank}.txt"
        lines = path.read_text().splitlines() if path.exists() else []
        out.append([[int(x) for x in line.split()[1:]] for line in lines])
    return out


def every_batch(train_dir) -> list[list[int]]:
    """Every global batch of epoch 0, in order (world 1, nothing dropped)."""
    return order_lines(train_dir, "--batch-events", str(BATCH))


@pytest.fixture(scope="module")
def distributed(torch):
    if not torch.distributed.is_available():
        if IN_CI:
            pytest.fail("torch.distributed is missing from this torch")
        pytest.skip("torch.distributed is not available")
    return torch.distributed


def test_ddp_ranks_get_equal_batches_and_every_event_at_most_once(train_dir, distributed,
                                                                  tmp_path):
    done = run(torchrun(3, "train_ddp.py", str(train_dir), "--checkpoint",
                        str(tmp_path / "ck.pt"), "--batch-events", str(BATCH), "--device", "cpu",
                        "--record", str(tmp_path / "rec"), "--timeout", "60"))
    assert "rank 0 of 3" in done.stdout and "done" in done.stdout
    ranks = records(tmp_path / "rec", 3)
    assert [len(r) for r in ranks] == [12, 12, 12], "300 events, 38 batches, 36 dealt"
    for rank, trained in enumerate(ranks):
        assert trained == order_lines(train_dir, "--batch-events", str(BATCH), "--rank",
                                      str(rank), "--world", "3", "--drop-last")
    seen = [e for r in ranks for b in r for e in b]
    assert len(seen) == len(set(seen)), "no event twice"
    every = every_batch(train_dir)
    dropped = {e for b in every[36:] for e in b}
    assert set(seen) | dropped == {e for b in every for e in b} and not set(seen) & dropped
    assert len(dropped) == 300 - 36 * BATCH, "the documented drop: the batches past 3 x 12"


def test_ddp_with_a_token_budget_deals_equal_steps_of_unequal_batches(train_dir, distributed,
                                                                     tmp_path):
    done = run(torchrun(3, "train_ddp.py", str(train_dir), "--checkpoint",
                        str(tmp_path / "ck.pt"), "--max-tokens", "256", "--device", "cpu",
                        "--record", str(tmp_path / "rec"), "--timeout", "60"))
    assert "rank 0 of 3" in done.stdout and "done" in done.stdout
    ranks = records(tmp_path / "rec", 3)
    grouped = ["--max-tokens", "256", "--group-by-length", "64", "--length-of", "doms"]
    every = order_lines(train_dir, *grouped)
    assert len(every) == 37 and sum(map(len, every)) == 300
    assert [len(r) for r in ranks] == [12, 12, 12], "37 batches, 36 dealt"
    for rank, trained in enumerate(ranks):
        assert trained == order_lines(train_dir, *grouped, "--rank", str(rank), "--world", "3",
                                      "--drop-last")
    seen = [e for r in ranks for b in r for e in b]
    assert len(seen) == len(set(seen)) == 300 - len(every[36]), "no event twice"
    sizes = [{len(r[step]) for r in ranks} for step in range(12)]
    assert sum(len(s) > 1 for s in sizes) >= 6, f"the ranks' batches differ in size: {sizes}"


EVENT_MEAN = """
import json, os, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
from distributed_exit import exit_without_finalising
from shardify.distributed import event_mean

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
cuts = [0, 2, 7, 16]  # 2, 5 and 9 events on the three ranks
mine = slice(cuts[rank], cuts[rank + 1])

def model():
    torch.manual_seed(1)
    return torch.nn.Linear(3, 1).double()

def gradient(loss_of):
    ddp = torch.nn.parallel.DistributedDataParallel(model())
    loss = loss_of((ddp(x[mine])[:, 0] - y[mine]) ** 2)
    loss.backward()
    values = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(values, loss.detach().reshape(1))
    return flat(ddp), sum(v.item() for v in values) / world

def flat(module):
    return torch.cat([p.grad.flatten() for p in module.parameters()]).tolist()

single = model()
whole = ((single(x)[:, 0] - y) ** 2).mean()
whole.backward()
if rank == 0:
    print(json.dumps({"single": (flat(single), whole.item()), "event_mean": gradient(event_mean),
                      "rank_mean": gradient(lambda v: v.mean())}))
else:
    gradient(event_mean), gradient(lambda v: v.mean())
dist.destroy_process_group()
exit_without_finalising()
"""


def test_event_mean_gives_one_process_s_gradient_over_every_rank_s_events(distributed,
                                                                          tmp_path):
    script = tmp_path / "event_mean.py"
    script.write_text(EVENT_MEAN)
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node=3", str(script), "unused", str(EXAMPLES)])
    got = json.loads(done.stdout.strip().splitlines()[-1])
    gradient, loss = got["single"]  # of the weights (3) and the bias (1)
    assert len(gradient) == 4
    assert got["event_mean"][0] == pytest.approx(gradient, rel=1e-12)
    assert got["event_mean"][1] == pytest.approx(loss, rel=1e-12), "the ranks' losses average "\
        "to the mean over every event"
    assert got["rank_mean"][0] != pytest.approx(gradient, rel=1e-3), "each rank's mean weighs "\
        "its events unequally"
    assert got["rank_mean"][1] != pytest.approx(loss, rel=1e-3)


def test_event_mean_without_a_process_group_is_the_mean(torch):
    from shardify.distributed import event_mean

    values = torch.tensor([1.0, 2.0, 6.0], dtype=torch.float64, requires_grad=True)
    loss = event_mean(values)
    loss.backward()
    assert loss.item() == 3.0 and values.grad.tolist() == [1 / 3] * 3
    half = event_mean(torch.full((70000,), 0.5, dtype=torch.float16))
    assert half.dtype == torch.float32 and half.item() == 0.5, "summed in float32"
    with pytest.raises(ValueError, match=r"values of shape \(2, 2\): give one value per event"):
        event_mean(torch.zeros(2, 2))


def test_sigterm_checkpoints_and_a_resume_at_another_world_sees_exactly_the_rest(
        train_dir, distributed, tmp_path, torch):
    checkpoint = tmp_path / "ck.pt"
    common = [str(train_dir), "--checkpoint", str(checkpoint), "--batch-events", str(BATCH),
              "--device", "cpu", "--timeout", "60"]
    job = subprocess.Popen(torchrun(3, "train_ddp.py", *common, "--record",
                                    str(tmp_path / "first"), "--step-delay", "0.5"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    first_rank = tmp_path / "first" / "rank-0.txt"
    deadline = time.monotonic() + 180
    while not (first_rank.exists() and len(first_rank.read_text().splitlines()) >= 3):
        assert job.poll() is None, f"the job ended before the signal:\n{job.communicate()}"
        assert time.monotonic() < deadline, "the job trained nothing in 3 minutes"
        time.sleep(0.1)
    job.send_signal(signal.SIGTERM)  # as Slurm's --signal=B:TERM, forwarded by the script
    out, err = job.communicate(timeout=120)
    first = records(tmp_path / "first", 3)
    steps = len(first[0])
    assert [len(r) for r in first] == [steps] * 3, f"ranks stopped together:\n{out}\n{err}"
    assert 3 <= steps < 12, "stopped mid-epoch"
    assert "preempted (SIGTERM): checkpointed" in out, err[-4000:]
    state = torch.load(checkpoint)["loader"]
    assert (state["epoch"], state["global_batches"], state["world"]) == (0, 3 * steps, 3)
    done = run(torchrun(2, "train_ddp.py", *common, "--resume", "--record",
                        str(tmp_path / "rest")))
    assert f"global batch {3 * steps} (saved at world 3, now 2)" in done.stdout
    rest = records(tmp_path / "rest", 2)
    assert len(rest[0]) == len(rest[1]), "every rank of the new world as many batches"
    every = every_batch(train_dir)
    dealt = [rest[k % 2][k // 2] for k in range(len(rest[0]) * 2)]
    trained = [b for r in first for b in r]
    assert sorted(map(tuple, trained)) == sorted(map(tuple, every[:3 * steps]))
    assert dealt == every[3 * steps:3 * steps + len(dealt)], "exactly the rest, in order"
    usable = 37  # 38 batches, the last incomplete: drop_last keeps 37, trimmed to the world
    assert 3 * steps + len(dealt) == usable - (usable - 3 * steps) % 2


@pytest.mark.parametrize("batching", [["--batch-events", "32"], ["--max-tokens", "512"]],
                         ids=["batch-events", "token-budget"])
def test_distributed_prediction_writes_every_event_once(train_dir, distributed, tmp_path,
                                                        batching):
    pq = importlib.import_module("pyarrow.parquet") if IN_CI else pytest.importorskip(
        "pyarrow.parquet")
    out = tmp_path / "submission.parquet"
    done = run(torchrun(3, "predict.py", str(train_dir), str(out), *batching, "--device",
                        "cpu"))
    assert "300 events from 3 rank(s)" in done.stdout
    table = pq.read_table(out).to_pydict()
    assert list(table) == ["event_id", "azimuth", "zenith"]
    ids = table["event_id"]
    assert ids == sorted(ids) and len(set(ids)) == 300
    assert all(0 <= a < 2 * math.pi for a in table["azimuth"])
    assert all(0 <= z <= math.pi for z in table["zenith"])
