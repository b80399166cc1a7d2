"""PyTorch Lightning (what GraphNeT trains with) given a shardify.Loader as it is: every
epoch whole, a checkpoint made at any step resumes exactly the batches that were left, and
under its DDP, which starts the processes' groups after the script made the loader, each
rank reads its share."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import shardify
from conftest import REPO, take

# Lightning's advice to run under `srun`, given at every Trainer on a machine where Slurm is
# installed (CI's, for tests/slurm.rs): 50 lines of each run's warnings summary, none ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The `srun` command is available on your system but is not used")


def recording_module(lightning, torch):
    """A LightningModule that records, per step, its epoch, batch index and event ids."""

    class Recording(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(1, 1)
            self.seen, self.validated = [], []

        def training_step(self, batch, index):
            self.seen.append((self.current_epoch, index, batch["event_id"].tolist()))
            mean_time = batch["pulse_time"].float().mean().reshape(1, 1) / 1e4
            return self.linear(mean_time).sum()

        def validation_step(self, batch, index):
            self.validated.append((self.current_epoch, batch["event_id"].tolist()))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    return Recording()


def fit(lightning, torch, train_dir, checkpoint=None, callbacks=(), validate=False,
        epochs=2, reload=0, **settings):
    """``epochs`` of Lightning (reloading its dataloaders every ``reload`` epochs) over a
    fresh loader (and, to ``validate``, an evaluation loader over the same events); the
    module, which recorded the steps, and in ``module.warned`` the loaders' warnings."""
    module = recording_module(lightning, torch)
    trainer = lightning.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=bool(callbacks), callbacks=list(callbacks),
        num_sanity_val_steps=0, limit_val_batches=3, reload_dataloaders_every_n_epochs=reload)
    loader = shardify.Loader(train_dir, device="cpu", **settings)
    val = shardify.Loader(train_dir, batch_events=20, shuffle=False, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Lightning's advice about workers and loggers too
        trainer.fit(module, train_dataloaders=loader, val_dataloaders=val if validate else None,
                    ckpt_path=checkpoint)
    module.warned = [str(w.message) for w in caught if str(w.message).startswith("Loader:")]
    return module


@pytest.mark.parametrize("settings", [
    pytest.param(dict(batch_events=48), id="events"),
    pytest.param(dict(max_pulses=3000, resident=True), id="pulse-budget-resident"),
])
def test_every_checkpoint_resumes_exactly_the_batches_left(train_dir, torch, lightning,
                                                          tmp_path, settings):
    from lightning.pytorch.callbacks import ModelCheckpoint

    every_step = ModelCheckpoint(dirpath=tmp_path / "step", every_n_train_steps=1,
                                 save_top_k=-1, filename="{step}")
    epoch_end = ModelCheckpoint(dirpath=tmp_path / "end", save_top_k=-1,
                                save_on_train_epoch_end=True, filename="{epoch}")
    module = fit(lightning, torch, train_dir, callbacks=[every_step, epoch_end], validate=True,
                 **settings)
    whole = module.seen
    # Validation limited to 3 batches: the same first 3 each time (Lightning's set_epoch).
    first_three = take(shardify.Loader(train_dir, batch_events=20, shuffle=False), 3)
    assert module.validated == [(e, b) for e in (0, 1) for b in first_three]
    for epoch in (0, 1):  # each epoch whole: Lightning never asked for the end of the first
        events = [e for seen_epoch, _, batch in whole if seen_epoch == epoch for e in batch]
        assert sorted(events) == sorted(set(events)) and len(events) == 300
    assert [i for e, i, _ in whole if e == 1] == list(range(len(whole) // 2))
    checkpoints = sorted((tmp_path / "step").iterdir()) + sorted((tmp_path / "end").iterdir())
    assert len(checkpoints) == len(whole) + 2
    for path in checkpoints:  # mid-epoch, an epoch's last step, an epoch's end
        steps = torch.load(path, weights_only=False)["global_step"]
        resumed = fit(lightning, torch, train_dir, checkpoint=str(path), **settings).seen
        assert whole[:steps] + resumed == whole, path.name


def epochs_of(seen, epochs: int) -> list[list[int]]:
    """The events each epoch of a recording module's steps trained, in order."""
    return [[e for epoch, _, batch in seen if epoch == wanted for e in batch]
            for wanted in range(epochs)]


def restart_warning(epoch: int, done: int, count: int, steps: int, ends: list[int],
                    first_count: int) -> str:
    """The loader's warning of ``epoch`` left after ``done`` of its ``count`` batches when
    Lightning restarted from the checkpoint of ``steps`` (at one of the epochs' ``ends``:
    the ended epoch's count kept, else the first ``len()``, ``first_count``)."""
    if steps in ends:
        kept = (f"the count of epoch {epoch - 1}, at whose end the job restarted",
                ", restarted from a checkpoint made at an epoch's last step, takes that "
                "epoch's count as the next one's limit")
    else:
        resumed_at = steps - ([0] + ends)[epoch]
        kept = (f"where the job resumed it (at batch {resumed_at}) with the count len() gave "
                f"for epoch 0, {first_count}",
                ", resuming mid-epoch, reads len() before it loads the loader's state and "
                "keeps it as the resumed epoch's limit")
    return (f"Loader: epoch {epoch} was left after {done} of its {count} batches, {kept[0]}: "
            f"its last {count - done} were not trained. Under a pulse or token budget each "
            f"epoch has its own number of batches, and PyTorch Lightning{kept[1]}, also when "
            f"it reloads its dataloaders. (Warned once per loader.)")


def test_a_budgets_epochs_of_other_lengths_are_whole_when_lightning_reloads(
        train_dir, torch, lightning, tmp_path):
    """Under a pulse budget each epoch has its own number of batches. Lightning keeps the
    len() it read at its start as every epoch's limit: an epoch with more batches loses
    its last ones, which the loader warns of, naming the fix. Reloading its dataloaders
    every epoch, Lightning reads each epoch's len(): every epoch whole. Restarted from a
    checkpoint, it still keeps a count read before as one epoch's limit: mid-epoch, the
    resumed epoch's (the first len(), read before the loader's state is loaded); at an
    epoch's last step, the next one's (the ended epoch's, by which it tells that the epoch
    ended). That epoch's batches are still the right ones, each once; when it has more, it
    loses its last ones, which the loader warns of too."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    budget = dict(max_pulses=500)
    counts = [shardify.Loader(train_dir, **budget)._batch_count(e, 0) for e in range(4)]
    assert max(counts[1:]) > counts[0], counts  # the case at hand: a longer epoch after

    kept = fit(lightning, torch, train_dir, epochs=4, **budget)
    lost = [300 - len(events) for events in epochs_of(kept.seen, 4)]
    assert [sum(1 for e, _, _ in kept.seen if e == epoch) for epoch in range(4)] == \
        [min(c, counts[0]) for c in counts]
    longer = next(e for e, c in enumerate(counts) if c > counts[0])
    assert lost[longer] > 0, lost  # the loss the warning is about really happened
    kept_warning = (
        f"Loader: epoch {longer} was left after {counts[0]} of its {counts[longer]} "
        f"batches, the count len() gave for epoch 0: its last {counts[longer] - counts[0]} "
        f"were not trained. Under a pulse or token budget each epoch has its own number of "
        f"batches, and PyTorch Lightning keeps the len() it read at its start as every "
        f"epoch's limit unless it reloads its dataloaders (as would a loop that reads len() "
        f"once): give the Trainer (or GraphNeT's fit) reload_dataloaders_every_n_epochs=1. "
        f"(Warned once per loader.)")
    assert kept.warned == [kept_warning]
    # The same epoch as the run's last: nothing asks the loader after it but Lightning
    # letting go of its iterator at the end of fit, which warns the same.
    last = fit(lightning, torch, train_dir, epochs=longer + 1, **budget)
    assert len(epochs_of(last.seen, longer + 1)[longer]) < 300  # cut there too
    assert last.warned == [kept_warning]

    every_step = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1,
                                 filename="{step}")
    reloaded = fit(lightning, torch, train_dir, epochs=4, reload=1, callbacks=[every_step],
                   **budget)
    whole = reloaded.seen
    assert [len(set(events)) for events in epochs_of(whole, 4)] == [300] * 4
    assert [sum(1 for e, _, _ in whole if e == epoch) for epoch in range(4)] == counts
    assert reloaded.warned == []
    # Restarted from a step's checkpoint, Lightning keeps a count it read before the loader
    # had its state (mid-epoch) or the ended epoch's (at an epoch's last step) as the
    # resumed or next epoch's limit: each epoch's batches are still the whole run's from
    # its start, and the first epoch left short (when another epoch follows) is warned of.
    ends = [sum(counts[:k + 1]) for k in range(3)]
    short_ones = []
    for steps in [1] + [s for end in ends for s in (end - 1, end, end + 1)]:
        resumed = fit(lightning, torch, train_dir, epochs=4, reload=1,
                      checkpoint=str(tmp_path / f"step={steps}.ckpt"), **budget)
        run = whole[:steps] + resumed.seen
        # Lightning's batch indexes may restart in a resumed epoch: compared are the batches.
        per_epoch = [[batch for e, _, batch in run if e == epoch] for epoch in range(4)]
        for epoch, done in enumerate(per_epoch):
            assert done == [batch for e, _, batch in whole if e == epoch][:len(done)], steps
        short = [(epoch, len(done)) for epoch, done in enumerate(per_epoch)
                 if len(done) < counts[epoch]]
        short_ones += short
        assert resumed.warned == [
            restart_warning(epoch, done, counts[epoch], steps, ends, counts[0])
            for epoch, done in short[:1]], steps
    # Lightning 2.6 leaves some short (if a later one does not, the warning is moot), the
    # run's last epoch among them, warned of when Lightning lets go of its iterator.
    assert short_ones, "every restart resumed its epochs whole"
    assert any(epoch == 3 for epoch, _ in short_ones), short_ones


DDP_SCRIPT = """
import json, os, sys, warnings
import lightning, torch, shardify
warnings.simplefilter("ignore")

class Recording(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.linear, self.seen = torch.nn.Linear(1, 1), []

    def training_step(self, batch, index):
        self.seen.append((self.current_epoch, batch["event_id"].tolist()))
        return self.linear(batch["pulse_time"].float().mean().reshape(1, 1) / 1e4).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

settings = json.loads(sys.argv[3])
loader = shardify.Loader(sys.argv[1], device="cpu", **settings["loader"])  # before any group
made_as = [loader.rank, loader.world]
module = Recording()
trainer = lightning.Trainer(max_epochs=settings["epochs"], accelerator="cpu", devices=2,
                            strategy="ddp", logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False,
                            reload_dataloaders_every_n_epochs=settings["reload"])
trainer.fit(module, train_dataloaders=loader)
with open(f"{sys.argv[2]}/rank-{trainer.global_rank}.json", "w") as out:
    json.dump({"made_as": made_as, "rank": loader.rank, "world": loader.world,
               "seen": module.seen}, out)
# gloo can abort a rank in the interpreter's finalisation (examples/distributed_exit.py).
torch.distributed.destroy_process_group()
del loader
sys.stdout.flush()
os._exit(0)
"""


def lightning_ddp(train_dir, tmp_path, loader: dict, epochs: int, reload: int) -> list[dict]:
    """DDP_SCRIPT's record of each of its 2 ranks."""
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    settings = json.dumps({"loader": loader, "epochs": epochs, "reload": reload})
    run = subprocess.run([sys.executable, str(script), str(train_dir), str(tmp_path), settings],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for r, record in enumerate(ranks):
        assert record["made_as"] == [0, 1], "made before the group: rank 0 of 1 then"
        assert (record["rank"], record["world"]) == (r, 2), "found when Lightning used it"
    return ranks


def test_its_ddp_gives_each_rank_its_share_of_a_loader_made_before(train_dir, torch,
                                                                   lightning, tmp_path):
    ranks = lightning_ddp(train_dir, tmp_path, dict(batch_events=16), epochs=2, reload=0)
    dropped_last = 300 // 32 * 32  # drop_last with 2 ranks: complete batch pairs only
    for epoch in (0, 1):
        events = [e for record in ranks for seen_epoch, batch in record["seen"]
                  if seen_epoch == epoch for e in batch]
        assert len(events) == len(set(events)) == dropped_last, "no event on two ranks"


def test_its_ddp_reloading_gives_each_rank_its_whole_share_of_every_budget_epoch(
        train_dir, torch, lightning, tmp_path):
    """A pulse budget's epochs differ in batches on each rank (18 and 19 here): reloading
    its dataloaders, Lightning's DDP trains each rank's whole share of every epoch, as the
    rank's own loader deals it."""
    budget = dict(max_pulses=500)
    ranks = lightning_ddp(train_dir, tmp_path, budget, epochs=3, reload=1)
    for r, record in enumerate(ranks):
        alone = shardify.Loader(train_dir, rank=r, world=2, device="cpu", output="numpy",
                                **budget)
        counts = [alone._batch_count(epoch, 0) for epoch in range(3)]
        assert len(set(counts)) > 1, counts  # the case at hand
        for epoch in range(3):
            alone.set_epoch(epoch)
            expected = [batch["event_id"].tolist() for batch in alone]
            assert [batch for e, batch in record["seen"] if e == epoch] == expected, (r, epoch)


def test_graphnets_way_graphs_to_train_and_validate(train_dir, torch, lightning, tmp_path):
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    from lightning.pytorch.callbacks import ModelCheckpoint
    from shardify.torch_geometric import GraphLoader
    from torch_geometric.data import Data
    from torch_geometric.nn import global_mean_pool

    class GraphNetShaped(lightning.LightningModule):
        """What GraphNeT's StandardModel does with a batch: a Data (or a list of them),
        node features pooled per graph, a loss against the ``direction`` label."""

        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(6, 3)
            self.trained, self.validated = [], []

        def step(self, batch):
            data = batch[0] if isinstance(batch, list) else batch
            assert isinstance(data, Data)
            pooled = global_mean_pool(self.linear(data.x), data.batch)
            return ((pooled - data.direction.float()) ** 2).mean(), data.event_id.tolist()

        def training_step(self, batch, index):
            loss, events = self.step(batch)
            self.trained.append((self.current_epoch, events))
            return loss

        def validation_step(self, batch, index):
            self.validated.append((self.current_epoch, self.step(batch)[1]))

        def predict_step(self, batch, index):
            return batch.event_id

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    train, val = shardify.Dataset(train_dir).split(0.2, seed=1)
    graph_settings = dict(standardize="graphnet", knn=4, max_pulses=32)

    def fit(checkpoint=None, callbacks=()):
        module = GraphNetShaped()
        trainer = lightning.Trainer(
            max_epochs=2, accelerator="cpu", devices=1, logger=False,
            enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, enable_checkpointing=bool(callbacks),
            callbacks=list(callbacks))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module,
                        GraphLoader(shardify.Loader(train, batch_events=40, device="cpu"),
                                    **graph_settings),
                        GraphLoader(shardify.Loader(val, batch_events=25, shuffle=False,
                                                    device="cpu"), **graph_settings),
                        ckpt_path=checkpoint)
        return module

    every_step = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1,
                                 filename="{step}")
    whole = fit(callbacks=[every_step])
    for epoch in (0, 1):
        trained = [e for seen, events in whole.trained if seen == epoch for e in events]
        assert sorted(trained) == sorted(train.event_ids().tolist())
        validated = [e for seen, events in whole.validated if seen == epoch for e in events]
        assert validated == val.event_ids().tolist(), "every validation event, stored order"
    for steps in (2, 6, 7):  # mid-epoch, the first epoch's last step, the second epoch
        resumed = fit(checkpoint=str(tmp_path / f"step={steps}.ckpt"))
        assert whole.trained[:steps] + resumed.trained == whole.trained
    # GraphNeT's predict_as_dataframe: predictions, then a second pass over the same loader
    # for the attributes to join (it asks for a SequentialSampler first).
    from torch.utils.data import SequentialSampler

    predicting = GraphLoader(shardify.Loader(val, batch_events=25, shuffle=False,
                                             device="cpu"), **graph_settings)
    assert isinstance(predicting.sampler, SequentialSampler)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False,
                                enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predicted = torch.cat(trainer.predict(GraphNetShaped(), predicting)).tolist()
    attributes = [e for graph in predicting for e in graph.event_id.tolist()]
    assert predicted == attributes == val.event_ids().tolist()
    assert len(predicted) == len(predicting.dataset)
