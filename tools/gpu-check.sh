#!/usr/bin/env bash
# Proves the CUDA path on a machine with an NVIDIA GPU and no Rust toolchain, from binaries
# built elsewhere. Build them first (on the build machine):
#
#   cargo build --release --bins --examples && cargo test --release --no-run
#   bash tools/build-wheel.sh target/wheels   # the wheel, for the Python stage
#   bash tools/gpu-check.sh --stage        # copies the binaries into .gpu-bin/ and the wheel
#                                          # and shardify-gen into .gpu-py/ (both ignored),
#                                          # and packs both into .gpu-stage.tgz (ignored;
#                                          # ~30 MB, where the folders are ~76 MB and the
#                                          # device tool carries 64 MiB): carry
#                                          # [".gpu-stage.tgz"], unpacked on the GPU machine
#   GPU_CHECK_BASELINE=COMMIT bash tools/gpu-check.sh --stage
#                                          # the same, and shardbench built from COMMIT too
#                                          # (a git worktree under target/, its own target
#                                          # directory: a full build the first time), which
#                                          # the Rust stage alternates with the current one
#                                          # before its other shardbench rows (below)
#
# then, on the GPU machine, from the repository root:
#
#   bash tools/gpu-check.sh [EVENTS]            # default 1000000
#   bash tools/gpu-check.sh --python [EVENTS [PEERS_SECONDS]]   # 320000, 5 (4 on 2 cores)
#   bash tools/gpu-check.sh --all [SECONDS]     # both in one call, within SECONDS (480)
#
# --all suits a lease of minutes: the Python stage first (its GPU tests first of all) with at
# most 65% of SECONDS and 3 s per peers.py loader (at 36aba7b its 60% of 540 s was cut during
# its last step, then compile-check, after 315 s of steps; the two peers.py runs take 97 and
# 117 s, so they now come last), then the Rust stage (159 s at 36aba7b, its baseline
# alternated) with what is left, both on 320k
# events, each stopped at its limit; whatever they wrote, finished or not (peers.py prints
# each round as it ends; each Python step logs its seconds), comes back in
# $OUT/gpu-check-all.tar.gz with each stage's log and exit status (124: its time ran out).
#
# The first runs the GPU tests (byte-identical epoch, raw-pointer consumer, overlap,
# allocation counters), the per-call cost of a copy (examples/h2d_overheads.rs), the
# example training loop on cuda:0, with a staged baseline the baseline's shardbench and the
# current one alternated (3 rounds, 8 workers on cuda:0, window 16: a loader change against
# the older code on the same machine in the same minutes, where these shared machines drift
# between runs; the current one also with 32 batches ahead, and what its workers waited
# for), shardbench with and without a 1 ms simulated step, and
# the CPU path on two of the machine's cores (taskset: issue 20's 2-worker figures on a
# fast CPU), and packs logs, JSON reports and the plot into $OUT/gpu-check.tar.gz (or
# ./gpu-check.tar.gz). The second installs the wheel in .gpu-py/ into the machine's python3
# (the one with torch; nothing is fetched) and runs the Python package's GPU tests
# (python/tests/test_gpu.py: DLPack's stream hand-over, resident batches, the adapters),
# tools/adapters_bench.py (the torch operations beside the Triton kernels, and the adapter's
# cost inside an unsynchronised training loop), examples/train_dynedge.py (with an empty
# Triton cache, then warm), examples/train_transformer.py,
# tools/resident_host_time.py, tools/compile_check.py (torch.compile of DynEdge), and
# tools/peers/peers.py on cuda:0 and on two CPU cores, into
# $OUT/gpu-check-python.tar.gz; a step that fails is logged and the others still run.
set -euo pipefail

bin=.gpu-bin
py=.gpu-py
stage=.gpu-stage.tgz
if [[ "${1:-}" == "--stage" ]]; then
    rm -rf "$bin"
    mkdir -p "$bin"
    cp target/release/shardify target/release/shardbench target/release/shardify-gen "$bin/"
    cp target/release/examples/train_loop target/release/examples/h2d_overheads "$bin/"
    gpu_test=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
    cp "$gpu_test" "$bin/gpu-tests"
    if [[ -n "${GPU_CHECK_BASELINE:-}" ]]; then
        base_src=target/gpu-baseline-src
        git worktree remove --force "$base_src" 2>/dev/null || rm -rf "$base_src"
        git worktree add --detach --quiet "$base_src" "$GPU_CHECK_BASELINE"
        cargo build --release --quiet --bin shardbench --manifest-path "$base_src/Cargo.toml" \
            --target-dir target/gpu-baseline
        cp target/gpu-baseline/release/shardbench "$bin/shardbench-baseline"
        base_commit=$(git -C "$base_src" rev-parse HEAD)
        git worktree remove --force "$base_src"
    fi
    strip "$bin"/*   # debug info makes them ~100 MB each; the device tool carries 64 MiB
    [[ -z "${base_commit:-}" ]] || echo "$base_commit" > "$bin/baseline-commit.txt"
    rm -rf "$py"
    mkdir -p "$py"
    cp "$bin/shardify-gen" "$py/"
    # The device machine's architecture is this one's (x86_64, as every machine lent so far).
    if ls target/wheels/shardify-*_"$(uname -m)".whl >/dev/null 2>&1; then
        cp target/wheels/shardify-*_"$(uname -m)".whl "$py/"
    else
        echo "gpu-check: no wheel in target/wheels (bash tools/build-wheel.sh target/wheels):" \
            "the Python stage will have nothing to install" >&2
    fi
    # The commit the staged builds come from (the device gets no .git): every figure names it.
    commit="$(git rev-parse HEAD)$([[ -z "$(git status --porcelain)" ]] || echo "+changes")"
    echo "$commit" | tee "$bin/commit.txt" > "$py/commit.txt"
    tar -czf "$stage" "$bin" "$py"
    du -sh "$bin" "$py" "$stage"
    exit 0
fi

# On the GPU machine: the staged builds come as one archive (or as the two folders).
if [[ -f "$stage" && -z "${GPU_CHECK_UNPACKED:-}" ]]; then
    tar -xzf "$stage"
fi
export GPU_CHECK_UNPACKED=1

if [[ "${1:-}" == "--all" ]]; then
    limit=${2:-480}
    if ! [[ "$limit" =~ ^[0-9]+$ ]] || ((limit < 10)); then
        echo "gpu-check --all: SECONDS must be a whole number of at least 10, not '$limit'" >&2
        exit 2
    fi
    final=${OUT:-.}
    scratch=$(mktemp -d)
    started=$SECONDS
    within() { # NAME SECONDS ARGS...: this script with ARGS, its output in $scratch, cut
        # after SECONDS (timeout signals its whole process group, the stage's children too)
        local name=$1 seconds=$2 status=0 from=$SECONDS
        shift 2
        OUT=$scratch timeout --kill-after=5 "$seconds" bash "$0" "$@" \
            > "$scratch/$name-stage.log" 2>&1 || status=$?
        echo "$name stage: exit status $status after $((SECONDS - from)) s" \
            | tee -a "$scratch/$name-stage.log"
    }
    within python $((limit * 65 / 100)) --python 320000 3
    tail -n 3 "$scratch/gpu-check-python/python-gpu-tests.log" 2>/dev/null || true
    rest=$((limit - (SECONDS - started)))
    ((rest > 0)) || rest=1 # `timeout 0` would mean no limit at all
    within rust "$rest" 320000
    grep -E "^test result" "$scratch/rust-stage.log" || true
    tar -czf "$final/gpu-check-all.tar.gz" -C "$scratch" .
    rm -rf "$scratch"
    exit 0
fi

if [[ "${1:-}" == "--python" ]]; then
    events=${2:-320000}
    peers_seconds=${3:-}
    out=${OUT:-.}/gpu-check-python
    work=$(mktemp -d)
    mkdir -p "$out"
    failed=()
    step() { # NAME COMMAND...: runs it, its output to the screen and $out/NAME.log, and
        # how long it took (what --all's share of a lease must hold)
        local name=$1 from=$SECONDS
        shift
        echo "== $name: $*"
        if ! "$@" 2>&1 | tee "$out/$name.log"; then
            echo "== $name FAILED" | tee -a "$out/$name.log"
            failed+=("$name")
        fi
        echo "== $name: $((SECONDS - from)) s" | tee -a "$out/$name.log"
    }
    wheel=$(ls "$py"/shardify-*.whl)
    echo "built from commit $(cat "$py/commit.txt")" | tee "$out/commit.txt"
    (nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true) \
        | tee "$out/gpu.txt"
    python3 -m pip install --quiet --no-index --no-deps --force-reinstall "$wheel"
    # The tests' generated dataset comes from shardify-gen where cargo would have put it.
    mkdir -p target/release
    cp "$py/shardify-gen" target/release/shardify-gen
    "$py/shardify-gen" "$work/src" --events "$events" --files 8 >/dev/null
    python3 -m shardify convert "$work/src" "$work/ds" --split train --seed 1 | tail -1
    step python-gpu-tests python3 -m pytest -q -rs python/tests/test_gpu.py
    step adapters-bench python3 tools/adapters_bench.py "$work/ds" --device cuda:0
    # Cold: an empty Triton cache (the benches above filled the default one), so its steady
    # state shows whether any kernel still compiles again as batch sizes change; then warm.
    for cache in cold warm; do
        step "train-dynedge-$cache" env TRITON_CACHE_DIR="$work/triton-cache" \
            python3 examples/train_dynedge.py "$work/ds" --device cuda:0 --stop-after 60
    done
    # The sequence models' path: time_ordered, pulse_features, pad_pulses to one shape.
    step train-transformer python3 examples/train_transformer.py "$work/ds" --device cuda:0 \
        --stop-after 60
    step resident-host-time python3 tools/resident_host_time.py "$work/ds" --device cuda:0
    # torch.compile (inductor: Triton code on the GPU) of DynEdge, the transforms untraced
    # (43 s at 36aba7b; before peers.py, whose rounds are the longest steps and come back
    # even when cut).
    step compile-check python3 tools/compile_check.py "$work/ds" --device cuda:0 \
        --batch-events 256 --max-pulses 256 --width 1.0
    step peers python3 tools/peers/peers.py "$work/src" --dataset "$work/ds" \
        --device cuda:0 --seconds "${peers_seconds:-5}" --json "$out/peers.json"
    # Issue 20's Python target (>= 0.9x the Rust loader, >= 10x numpy) on 2 cores of this CPU.
    step peers-cpu-2-cores taskset -c 0,1 python3 tools/peers/peers.py "$work/src" \
        --dataset "$work/ds" --seconds "${peers_seconds:-4}" --json "$out/peers-cpu-2-cores.json"
    rm -rf "$work"
    tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
    if (( ${#failed[@]} )); then
        echo "gpu-check --python: failed: ${failed[*]}" >&2
        exit 1
    fi
    exit 0
fi

events=${1:-1000000}
out=${OUT:-.}/gpu-check
work=$(mktemp -d)
mkdir -p "$out"
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "no nvidia-smi") | tee "$out/gpu.txt"
echo "built from commit $(cat "$bin/commit.txt" 2>/dev/null || echo "(not recorded)")" \
    | tee "$out/commit.txt"

echo "== GPU tests"
"$bin/gpu-tests" --nocapture --test-threads 1 2>&1 | tee "$out/gpu-tests.log"

echo "== host-to-device cost of each call in the copy path"
for piece in 436480 1745920; do
    "$bin/h2d_overheads" "$piece" $((1600000000 / piece)) 2>&1 | tee -a "$out/h2d-overheads.log"
done

echo "== data: $events events"
"$bin/shardify-gen" "$work/src" --events "$events" --files 8 >/dev/null
"$bin/shardify" convert "$work/src" "$work/ds" --split train 2>&1 | tail -3 | tee "$out/convert.log"

echo "== example training loop on cuda:0 (lazy checksums: epoch 0 hashes each shard; then full)"
for policy in lazy full; do
    "$bin/train_loop" "$work/ds" 2 cuda:0 "$policy" 2>&1 | tee -a "$out/train_loop.log"
done

bench() { # NAME ARGS...: one shardbench run on cuda:0, log and JSON under $out
    local name=$1
    shift
    echo "== shardbench $name: $*"
    "$bin/shardbench" "$work/ds" --device cuda:0 --json "$out/shardbench-$name.json" "$@" \
        2>&1 | tee "$out/shardbench-$name.log"
}
if [[ -x "$bin/shardbench-baseline" ]]; then
    # The current build also with 32 batches ahead: if its workers wait for staging buffers
    # (batches leave in order, so one stalled worker holds the others' buffers back), more
    # of them should show here. Each current row's waits and CPUs busy go into the log.
    echo "== baseline $(cat "$bin/baseline-commit.txt") against the current build, alternated"
    for round in 1 2 3; do
        for build in baseline current current-prefetch32; do
            exe="$bin/shardbench"
            extra=()
            [[ "$build" == baseline ]] && exe="$bin/shardbench-baseline"
            [[ "$build" == current-prefetch32 ]] && extra=(--prefetch 32)
            log="$out/shardbench-ab-$build-$round.log"
            "$exe" "$work/ds" --device cuda:0 --no-baselines --windows 16 --workers 8 \
                "${extra[@]}" > "$log" 2>&1 || true
            rate=$(awk '$1 == "shardify" && $2 == 16 {print $3}' "$log")
            waits=$(grep -o 'the workers outside the gather [^;]*' "$log" || true)
            busy=$(grep -o '[0-9.]* CPUs busy' "$log" || true)
            echo "round $round: $build ${rate:-(no row: see its log)} events/s ${waits:+($waits; $busy)}" \
                | tee -a "$out/shardbench-ab.log"
        done
    done
fi
# The targets: a 1 ms step per batch, and the copy stage against pinned H2D.
bench w2-compute1 --no-baselines --windows 1,16 --workers 2 --simulate-compute 1
bench w8-compute1 --no-baselines --windows 1,16 --workers 8 --simulate-compute 1
# Raw delivery (no step): how far the host side can feed the GPU.
bench w2 --no-baselines --windows 1,16 --workers 2
bench w8 --no-baselines --windows 1,16 --workers 8
# 8 workers at the old default of 4 batches ahead, against the rows above at the default
# since d8d6ce2 (twice the workers, at most the cores): 0.66x at fea401d, the consumer
# waiting 28%.
bench w8-prefetch4 --no-baselines --windows 1,16 --workers 8 --prefetch 4
bench w16-b1024 --no-baselines --windows 1,16 --workers 16 --batch-events 1024
bench w8-timed --no-baselines --windows 1,16 --workers 8 --time-copies
bench w8-runs8 --no-baselines --windows 1,16 --workers 8 --run-events 8
# Side by side with the Parquet baselines, on this machine's disk and cores.
bench w8-baselines --windows 1,4,16,64 --workers 8 --baseline-seconds 10 \
    --plot "$out/shardbench-w8-baselines.svg"
# Issue 20's targets on this CPU: 2 workers, the CPU path, the machine's 16 cores and 2 of
# them (the CI class), on 320k events as the issue measures them.
echo "== CPU path, 2 workers, 320k events: all cores, then taskset -c 0,1"
"$bin/shardify-gen" "$work/src320k" --events 320000 --files 8 >/dev/null
"$bin/shardify" convert "$work/src320k" "$work/ds320k" --split train --seed 1 >/dev/null 2>&1
for cores in all 0,1; do
    run=()
    [[ "$cores" == all ]] || run=(taskset -c "$cores")
    ${run[@]+"${run[@]}"} "$bin/shardbench" "$work/ds320k" --no-baselines --windows 1,4,16,64 \
        --workers 2 --device cpu --json "$out/shardbench-cpu-cores-${cores/,/-}.json" 2>&1 \
        | tee "$out/shardbench-cpu-cores-${cores/,/-}.log"
done
rm -rf "$work"
# One file back: the device tool returns a limited number of files.
tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
