"""Issue 20's CPU targets, measured and judged in one command, on the machine it runs on.

    python tools/host_check.py [--work DIR] [--events N] [--runs R] [--epochs E]
                               [--peers-seconds S] [--peers-rounds K] [--no-peers]
                               [--layout columns|records] [--bin DIR] [--json FILE]

Makes once, and keeps under --work (target/host-check): N events with the real statistics
(`shardify-gen --events N --files 8`, 320k by default) and their conversion (`shardify convert
--split train --seed 1`). Then R times (3): copies the dataset afresh (`shardify copy`, so
every run reads pages of the same age, as the results in docs/results.md were taken; in the
layout --layout names, `columns` by default, as `convert` writes) and runs
`shardbench COPY --no-baselines --windows 1,4,16,64 --workers 2 --device cpu --epochs E` (9);
then once `tools/peers/peers.py SOURCE --dataset COPY --window 16` (S seconds a loader, 6; K
rounds, 5). Build first: `cargo build --release --bins`, and the package installed in the
Python that runs this (`bash tools/test-all.sh`, the README's test command, does both).

Prints every shardbench row (its window, where the host placed the two threads' caches, the
median of its epochs' delivered bytes over the memcpy around each, events/s), then per
placement and window the median over the runs (with the scattered-copy bound's and the bare
gather's share of memcpy, and the loader's of their paces: a target the bare gather misses
too is the gather's to reach, not the pipeline's), and each target with its figure: delivered
>= 0.7 of memcpy at windows 4, 16 and 64; window 1 against the 0.71 the issue was filed at
(on a Zen 5: on another CPU a guide, not a measurement of "not lower"); through Python
>= 10x the numpy block shuffle and >= 0.9x the Rust loader (paired rounds), the Rust
loader's own events/s beside them. A placement's verdict stands only for that placement:
ratios to memcpy of a shared-L3 row and a split row do not compare (shardbench's
`CachePlacement`). --json writes the layout, every row, the summary, the Python figures and
the verdicts.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WINDOWS = (1, 4, 16, 64)
WIDE_WINDOWS = (4, 16, 64)
DELIVERED_TARGET = 0.7
WINDOW_1_AT_FILING = 0.71
NUMPY_TARGET = 10.0
RUST_TARGET = 0.9
# shardbench's `CachePlacement`s, and the word for a row whose placement was not timed.
PLACEMENTS = ("shared", "split", "changed", "untimed")
TORCH_ROW = "shardify -> torch tensors"
RUST_ROW = "shardify, Rust loader alone (bound)"
NUMPY_ROW = "numpy block shuffle"


def delivered_target(window: int) -> float:
    """The least delivered / memcpy that meets the issue's target at `window`: 0.7 at the
    wide windows, the figure at filing at window 1."""
    return DELIVERED_TARGET if window in WIDE_WINDOWS else WINDOW_1_AT_FILING


def progress(step: str) -> None:
    """What the check does now, on stderr (a run takes minutes)."""
    print(f"host_check: {step}", file=sys.stderr, flush=True)


def run(command: list[str], log: Path) -> None:
    """Runs `command`, its output into `log`; a failure names the command and the log."""
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text()[-2000:]
        sys.exit(f"host_check: {' '.join(command)} failed ({done.returncode}); {log}:\n{tail}")


def prepare(work: Path, events: int, binaries: Path) -> tuple[Path, Path]:
    """The generated source and its conversion under `work`, made when missing (a source
    whose generation did not finish, or a dataset without its manifest, is made again)."""
    source, dataset = work / f"gen{events}", work / f"ds{events}"
    generated = work / f"gen{events}.done"
    if not generated.exists():
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(dataset, ignore_errors=True)
        run([str(binaries / "shardify-gen"), "--events", str(events), "--files", "8",
             str(source)], work / "gen.log")
        generated.touch()
    if not (dataset / "manifest.json").exists():
        shutil.rmtree(dataset, ignore_errors=True)
        run([str(binaries / "shardify"), "convert", str(source), str(dataset), "--split",
             "train", "--seed", "1"], work / "convert.log")
    return source, dataset


def fresh_copy(dataset: Path, work: Path, binaries: Path, layout: str) -> Path:
    """`dataset` copied again by `shardify copy` in `layout` (the last copy removed first)."""
    copy = work / f"{dataset.name}-copy"
    shutil.rmtree(copy, ignore_errors=True)
    run([str(binaries / "shardify"), "copy", str(dataset), str(copy), "--layout", layout],
        work / "copy.log")
    return copy


def shardbench_rows(report: dict, run_number: int) -> list[dict]:
    """The shardify rows of one shardbench report, with what the targets read of them."""
    return [{
        "run": run_number,
        "window": row["window"],
        "placement": row.get("cache_placement") or "untimed",
        "delivered_over_memcpy": row["median_paired_ratio_to_memcpy"],
        "events_per_s": row["events_per_s"],
        "memcpy_at_start_gb_per_s": report["memcpy_gb_per_s"],
        "bound_over_memcpy": row.get("scattered_copy_bound_ratio_to_memcpy"),
        "loader_over_bound": row.get("ratio_to_scattered_copy"),
        "bare_gather_over_memcpy": row.get("bare_gather_bound_ratio_to_memcpy"),
        "loader_over_bare_gather": row.get("ratio_to_bare_gather"),
        "cpus_busy": row.get("cpus_busy"),
    } for row in report["loaders"] if row.get("window") is not None]


def summarise(rows: list[dict]) -> list[dict]:
    """Per placement and window: the rows, their median delivered / memcpy, how many reached
    the target, and the medians of the scattered-copy bound over memcpy and of the loader
    over the bound's pace (where the host's placement moves the bound itself, the loader's
    share of it says whether the loader lost anything of its own), and the same two of the
    bare gather (the loader's threads gathering the same batches without the pipeline: where
    it is under the target, the gather, not the pipeline, is what misses); shared, split,
    then rows that moved during their epochs or were not timed, windows ascending."""
    placements = [p for p in PLACEMENTS if any(row["placement"] == p for row in rows)]
    summary = []
    for placement in placements:
        for window in WINDOWS:
            group = [r for r in rows if r["placement"] == placement and r["window"] == window]
            if not group:
                continue
            ratios = [r["delivered_over_memcpy"] for r in group]
            target = delivered_target(window)
            summary.append({
                "placement": placement,
                "window": window,
                "rows": len(group),
                "median_delivered_over_memcpy": statistics.median(ratios),
                "target": target,
                "rows_at_target": sum(r >= target for r in ratios),
                "median_bound_over_memcpy": median_of(group, "bound_over_memcpy"),
                "median_loader_over_bound": median_of(group, "loader_over_bound"),
                "median_bare_gather_over_memcpy": median_of(group, "bare_gather_over_memcpy"),
                "median_loader_over_bare_gather": median_of(group, "loader_over_bare_gather"),
            })
    return summary


def median_of(rows: list[dict], key: str) -> float | None:
    """The median of `key` over the rows that have it; `None` where none has."""
    known = [r[key] for r in rows if r[key] is not None]
    return statistics.median(known) if known else None


def peers_figures(report: dict) -> dict:
    """Through Python: torch tensors over the numpy block shuffle (events/s, same run) and
    over the Rust loader (the median of the paired rounds), as peers.py prints them, with
    the Rust loader's own events/s."""
    numpy = next(row for row in report["loaders"] if row["name"] == NUMPY_ROW)
    torch = next(row for row in report["shardify"] if row["name"] == TORCH_ROW)
    rust = next(row for row in report["shardify"] if row["name"] == RUST_ROW)
    return {
        "numpy_events_per_s": numpy["events_per_s"],
        "torch_events_per_s": torch["events_per_s"],
        "rust_events_per_s": rust["events_per_s"],
        "torch_over_numpy": torch["events_per_s"] / numpy["events_per_s"],
        "torch_over_rust_paired": torch["median_paired_ratio_to_rust"],
        "paired_rounds": torch["paired_ratios_to_rust"],
    }


def verdicts(summary: list[dict], peers: dict | None) -> list[dict]:
    """Each target with its figure and whether it holds: the wide windows' and window 1's
    per placement, then the two through Python."""
    out = []
    for s in summary:
        wide = s["window"] in WIDE_WINDOWS
        words = (f">= {DELIVERED_TARGET} of memcpy" if wide
                 else f"not under {WINDOW_1_AT_FILING} (at filing)")
        out.append({
            "target": f"window {s['window']}, {s['placement']}: delivered {words}",
            "figure": s["median_delivered_over_memcpy"],
            "holds": s["median_delivered_over_memcpy"] >= s["target"],
            "bare_gather": s["median_bare_gather_over_memcpy"],
        })
    if peers is not None:
        out.append({"target": "Python, window 16: >= 10x the numpy block shuffle",
                    "figure": peers["torch_over_numpy"],
                    "holds": peers["torch_over_numpy"] >= NUMPY_TARGET})
        out.append({"target": "Python, window 16: >= 0.9x the Rust loader (paired)",
                    "figure": peers["torch_over_rust_paired"],
                    "holds": peers["torch_over_rust_paired"] >= RUST_TARGET})
    return out


def print_report(at: str | None, machine: dict, args: argparse.Namespace, rows: list[dict],
                 summary: list[dict], peers: dict | None, judged: list[dict]) -> None:
    """The commit measured (`at`), the rows, the medians per placement and window, Python's
    figures and the verdicts."""
    print(f"commit {at}; {machine['cpu_model']} ({machine['cpu_signature']}), "
          f"{machine['cpus']} CPUs; {args.events} events in the {args.layout} layout, "
          f"{args.runs} shardbench runs of {args.epochs} epochs (logs and reports in "
          f"{args.work})")
    print(f"{'run':>3} {'window':>6} {'placement':>10} {'delivered/memcpy':>17} "
          f"{'events/s':>10} {'memcpy at start':>16} (GB/s)")
    for r in rows:
        print(f"{r['run']:>3} {r['window']:>6} {r['placement']:>10} "
              f"{r['delivered_over_memcpy']:>17.2f} {r['events_per_s'] / 1e6:>9.2f}M "
              f"{r['memcpy_at_start_gb_per_s']:>16.1f}")
    for s in summary:
        line = (f"{s['placement']}, window {s['window']}: median "
                f"{s['median_delivered_over_memcpy']:.2f} over {s['rows']} rows, "
                f"{s['rows_at_target']} at {s['target']} or more")
        if s["median_bound_over_memcpy"] is not None and s["median_loader_over_bound"] is not None:
            line += (f"; the scattered-copy bound {s['median_bound_over_memcpy']:.2f} of memcpy, "
                     f"the loader at {s['median_loader_over_bound']:.2f} of its pace")
        if (s["median_bare_gather_over_memcpy"] is not None
                and s["median_loader_over_bare_gather"] is not None):
            line += (f"; the bare gather {s['median_bare_gather_over_memcpy']:.2f} of memcpy, "
                     f"the loader at {s['median_loader_over_bare_gather']:.2f} of its pace")
        print(line)
    if peers is not None:
        rounds = ", ".join(f"{r:.2f}" for r in peers["paired_rounds"])
        print(f"Python: torch tensors {peers['torch_events_per_s'] / 1e6:.2f}M events/s, "
              f"{peers['torch_over_numpy']:.1f}x the numpy block shuffle "
              f"({peers['numpy_events_per_s'] / 1e3:.0f}k), {peers['torch_over_rust_paired']:.2f}x "
              f"the Rust loader paired (rounds {rounds}; the Rust loader alone "
              f"{peers['rust_events_per_s'] / 1e6:.2f}M events/s)")
    for v in judged:
        bare = v.get("bare_gather")
        alone = (f"; the gather alone, without the pipeline, {bare:.2f}"
                 if bare is not None else "")
        print(f"{'holds' if v['holds'] else 'MISSED'}: {v['target']} ({v['figure']:.2f}{alone})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / "target" / "host-check")
    ap.add_argument("--events", type=int, default=320_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=9)
    ap.add_argument("--peers-seconds", type=float, default=6.0)
    ap.add_argument("--peers-rounds", type=int, default=5)
    ap.add_argument("--no-peers", action="store_true", help="shardbench's targets alone")
    ap.add_argument("--layout", choices=("columns", "records"), default="columns",
                    help="the copies' shard layout (shardify copy --layout)")
    ap.add_argument("--bin", type=Path, default=REPO / "target" / "release")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs: at least 1")
    for name in ("shardify", "shardify-gen", "shardbench"):
        if not (args.bin / name).exists():
            ap.error(f"no {args.bin / name}: build first (cargo build --release --bins)")
    at = commit()  # read before the runs: the tree may change while they run
    args.work.mkdir(parents=True, exist_ok=True)
    progress(f"data: {args.events} events under {args.work} (made once)")
    source, dataset = prepare(args.work, args.events, args.bin)
    rows, machine = [], None
    for number in range(1, args.runs + 1):
        progress(f"shardbench run {number} of {args.runs}")
        copy = fresh_copy(dataset, args.work, args.bin, args.layout)
        report_path = args.work / f"shardbench-{number}.json"
        run([str(args.bin / "shardbench"), str(copy), "--no-baselines", "--windows",
             ",".join(map(str, WINDOWS)), "--workers", "2", "--device", "cpu", "--epochs",
             str(args.epochs), "--json", str(report_path)], args.work / f"shardbench-{number}.log")
        report = json.loads(report_path.read_text())
        machine = report["machine"]
        rows += shardbench_rows(report, number)
    peers = None
    if not args.no_peers:
        progress("peers.py")
        copy = fresh_copy(dataset, args.work, args.bin, args.layout)
        peers_path = args.work / "peers.json"
        run([sys.executable, str(REPO / "tools" / "peers" / "peers.py"), str(source),
             "--dataset", str(copy), "--window", "16", "--seconds", str(args.peers_seconds),
             "--rounds", str(args.peers_rounds), "--json", str(peers_path)],
            args.work / "peers.log")
        peers = peers_figures(json.loads(peers_path.read_text()))
    summary = summarise(rows)
    judged = verdicts(summary, peers)
    print_report(at, machine, args, rows, summary, peers, judged)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": machine, "commit": at, "layout": args.layout, "rows": rows,
            "summary": summary, "peers": peers, "verdicts": judged}, indent=1))


def commit() -> str | None:
    """The repository's commit, with `+` when the tree has changes; `None` outside git."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


if __name__ == "__main__":
    main()
