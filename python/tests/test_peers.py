"""tools/peers/peers.py (the Python-side benchmark) runs end to end on the fixtures and
reports every loader it promises, with figures that are measured (positive, consistent)."""

import json
import subprocess
import sys
from pathlib import Path

import shardify
from conftest import FIXTURES, REPO


def test_peers_reports_every_loader_and_torchs_floor(train_dir, torch, tmp_path):
    report = tmp_path / "peers.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "peers" / "peers.py"), str(FIXTURES),
         "--dataset", str(train_dir), "--seconds", "0.3", "--batch-events", "32",
         "--json", str(report)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    figures = json.loads(report.read_text())
    assert figures["machine"]["cpus"] >= 1
    model = figures["machine"]["cpu_model"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "model name" in cpuinfo.read_text():
        assert model and f"CPUs ({model}" in done.stdout, done.stdout
        # The family and model numbers too (a VM's model name can hide which CPU it is).
        fields = dict(line.split(":", 1) for line in cpuinfo.read_text().splitlines()
                      if ":" in line and line.split(":")[0].strip() in ("cpu family", "model"))
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        signature = figures["machine"]["cpu_signature"]
        assert f" family {fields['cpu family']} model {fields['model']} stepping " in signature
        assert f"; {signature}" in done.stdout, done.stdout
    if Path("/sys/devices/system/cpu/cpu0/cache/index0").exists():
        cache = figures["machine"]["last_level_cache"]
        assert cache["bytes"] >= 4096 and f"; L{cache['level']} " in done.stdout, cache
    assert [row["name"] for row in figures["loaders"]] == [
        "pytorch Dataset + DataLoader", "numpy block shuffle"]
    package = {row["name"]: row for row in figures["shardify"]}
    assert list(package) == [
        "shardify, Rust loader alone (bound)", "shardify -> torch tensors",
        "shardify -> DLPack capsules, no tensors", "shardify -> numpy arrays",
        "shardify -> torch, workers' policy normal",
        "shardify -> torch, waiting thread sleeps",
        "shardify resident (cpu, window 16)",
        "shardify resident (cpu, complete shuffle)"]
    for row in [*figures["loaders"], *figures["shardify"]]:
        assert row["events_per_s"] > 0, row["name"]
    rust = package["shardify, Rust loader alone (bound)"]
    for row in package.values():
        assert abs(row["ratio_to_rust"] - row["events_per_s"] / rust["events_per_s"]) < 1e-9
        # Round by round against the Rust loader's run of the same round (3 by default).
        paired = [a / b for a, b in zip(row["runs"], rust["runs"], strict=True)]
        assert len(paired) == 3 and row["paired_ratios_to_rust"] == paired, row
        assert row["median_paired_ratio_to_rust"] == sorted(paired)[1], row
    assert rust["paired_ratios_to_rust"] == [1.0, 1.0, 1.0]
    # Each round reaches stderr as it ends (a run cut by a time limit keeps them), with the
    # round's figures for every loader and each one's ratio to that round's Rust loader.
    rounds = [line for line in done.stderr.splitlines() if line.startswith("round ")]
    assert len(rounds) == 3, done.stderr
    for i, line in enumerate(rounds):
        assert line.startswith(f"round {i + 1} of 3: "), line
        for name, row in package.items():
            figure = f"{name} {row['runs'][i] / 1e6:.2f}M events/s"
            if row is not rust:
                figure += f" ({row['paired_ratios_to_rust'][i]:.2f}x)"
            assert figure in line, (figure, line)
    # Every row runs whole epochs (every event of the dataset once per epoch, so a whole
    # number of them), counted per epoch: each epoch is the dataset's batches of 32.
    events = shardify.Dataset(train_dir).events
    for name, row in package.items():
        if name == "shardify, Rust loader alone (bound)":
            continue  # counted by the native drain, batch by batch
        epochs, left = divmod(row["events"], events)
        assert epochs > 0 and left == 0, row
        assert row["batches"] == epochs * -(-events // 32), row
    assert "the package's own side of a torch batch (its capsules, no tensors): paired " in (
        done.stdout)
    assert "paired: the median of each round's run over the Rust loader's run" in done.stdout
    floor = package["shardify -> torch tensors"]["torch_wrap_floor_us_per_batch"]
    assert 0 < floor < 1000, floor
    with_floor = package["shardify -> torch tensors"]["ratio_to_rust_with_floor_added"]
    assert abs(with_floor - rust["us_per_batch"] / (rust["us_per_batch"] + floor)) < 1e-9
    added = f"the floor alone added to each of the Rust loader's batches gives {with_floor:.2f}x"
    assert added in done.stdout
    # CPU time: every row's, measured (a loader that gathers on threads uses CPU while it
    # runs, on at most every CPU of the machine, with a little slack for the clocks).
    for row in package.values():
        assert row["cpu_us_per_batch"] > 0, row
        assert row["cpu_us_per_batch"] in row["cpu_us_per_batch_runs"], row  # its median run's
        assert 0 < row["busy_cpus"] <= figures["machine"]["cpus"] * 1.1, row
        assert abs(row["busy_cpus"] - row["cpu_us_per_batch"] / row["us_per_batch"]) < 1e-9, row
    # Round by round: each run's CPU per batch less the Rust loader's in the same round.
    torch_row = package["shardify -> torch tensors"]
    added_cpu = sorted(t - r for t, r in zip(
        torch_row["cpu_us_per_batch_runs"], rust["cpu_us_per_batch_runs"], strict=True))
    assert torch_row["median_paired_cpu_added_us_per_batch"] == added_cpu[1], torch_row
    assert rust["median_paired_cpu_added_us_per_batch"] == 0, rust
    from_cpu = torch_row["ratio_to_rust_from_cpu_added"]
    expected = rust["cpu_us_per_batch"] / (rust["cpu_us_per_batch"] + added_cpu[1])
    assert abs(from_cpu - expected) < 1e-9, torch_row
    assert f"with every core gathering leaves {from_cpu:.2f}x; " in done.stdout
    on_cpu = torch_row["ratio_to_rust_with_floor_cpu_added"]
    assert abs(on_cpu - rust["cpu_us_per_batch"] / (rust["cpu_us_per_batch"] + floor)) < 1e-9
    assert f"torch's floor alone would leave {on_cpu:.2f}x" in done.stdout
    assert "torch's own floor: wrapping a batch's capsules" in done.stdout
    # The consumer's CPU split: the capsules row's, then torch's over it, round by round.
    capsules = package["shardify -> DLPack capsules, no tensors"]
    inside = sorted(t - c for t, c in zip(
        torch_row["cpu_us_per_batch_runs"], capsules["cpu_us_per_batch_runs"], strict=True))[1]
    assert torch_row["torch_over_capsules_cpu_us_per_batch"] == inside, torch_row
    split = (f"of which the package's capsules "
             f"{capsules['median_paired_cpu_added_us_per_batch']:.1f} us (paired), and torch's "
             f"tensors with the batch's dict {inside:.1f} us more (paired over the capsules "
             f"row), {inside / floor:.1f}x torch's floor timed alone")
    assert split in done.stdout, done.stdout
    # The floor again after a batch's payload went through the caches: the payload is the
    # first batch's (32 events of the fixtures: every section's bytes), the floor measured.
    first = next(iter(shardify.Loader(train_dir, batch_events=32, output="numpy",
                                      device="cpu")))
    payload = sum(a.nbytes for a in first.values())
    assert torch_row["batch_payload_bytes"] == payload, torch_row
    cold = torch_row["torch_wrap_cold_floor_us_per_batch"]
    assert 0 < cold < 1000, cold
    assert (f"(one batch's {payload / 1024:.0f} KiB copied through them before each batch): "
            f"{cold:.1f} us, {cold / floor:.1f}x the floor timed alone; torch's tensors with "
            f"the dict inside the loader {inside / cold:.1f}x that") in done.stdout, done.stdout


def test_peers_refuses_an_even_round_count(train_dir):
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "peers" / "peers.py"), str(FIXTURES),
         "--dataset", str(train_dir), "--rounds", "2"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert "--rounds 2: expected an odd count of at least 1" in done.stderr
