#!/usr/bin/env bash
# Proves the CUDA path on a machine with an NVIDIA GPU and no Rust toolchain, from binaries
# built elsewhere. Build them first (on the build machine):
#
#   cargo build --release --bins --examples && cargo test --release --no-run
#   bash tools/gpu-check.sh --stage        # copies the binaries into .gpu-bin/ (ignored;
#                                          # carry it: the device tool's carry [".gpu-bin"])
#
# then, on the GPU machine, from the repository root:
#
#   bash tools/gpu-check.sh [EVENTS]       # default 1000000
#
# It runs the GPU tests (byte-identical epoch, raw-pointer consumer, overlap, allocation
# counters), the per-call cost of a copy (examples/h2d_overheads.rs), the example
# training loop on cuda:0, and shardbench with and without a 1 ms simulated step, and
# packs logs, JSON reports and the plot into $OUT/gpu-check.tar.gz (or ./gpu-check.tar.gz).
set -euo pipefail

bin=.gpu-bin
if [[ "${1:-}" == "--stage" ]]; then
    mkdir -p "$bin"
    cp target/release/shardify target/release/shardbench target/release/shardify-gen "$bin/"
    cp target/release/examples/train_loop target/release/examples/h2d_overheads "$bin/"
    gpu_test=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
    cp "$gpu_test" "$bin/gpu-tests"
    strip "$bin"/*   # debug info makes them ~100 MB each; the device tool carries 64 MiB
    du -sh "$bin"
    exit 0
fi

events=${1:-1000000}
out=${OUT:-.}/gpu-check
work=$(mktemp -d)
mkdir -p "$out"
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "no nvidia-smi") | tee "$out/gpu.txt"

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
# The targets: a 1 ms step per batch, and the copy stage against pinned H2D.
bench w2-compute1 --no-baselines --windows 1,16 --workers 2 --simulate-compute 1
bench w8-compute1 --no-baselines --windows 1,16 --workers 8 --simulate-compute 1
# Raw delivery (no step): how far the host side can feed the GPU.
bench w2 --no-baselines --windows 1,16 --workers 2
bench w8 --no-baselines --windows 1,16 --workers 8
bench w16-b1024 --no-baselines --windows 1,16 --workers 16 --batch-events 1024
bench w8-timed --no-baselines --windows 1,16 --workers 8 --time-copies
bench w8-runs8 --no-baselines --windows 1,16 --workers 8 --run-events 8
# Side by side with the Parquet baselines, on this machine's disk and cores.
bench w8-baselines --windows 1,4,16,64 --workers 8 --baseline-seconds 10 \
    --plot "$out/shardbench-w8-baselines.svg"
rm -rf "$work"
# One file back: the device tool returns a limited number of files.
tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
