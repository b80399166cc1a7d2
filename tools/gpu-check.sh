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
# counters), the example training loop on cuda:0, and shardbench with a 1 ms simulated
# step, writing logs and the JSON report under $OUT (or ./gpu-check-out).
set -euo pipefail

bin=.gpu-bin
if [[ "${1:-}" == "--stage" ]]; then
    mkdir -p "$bin"
    cp target/release/shardify target/release/shardbench target/release/shardify-gen "$bin/"
    cp target/release/examples/train_loop "$bin/"
    gpu_test=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
    cp "$gpu_test" "$bin/gpu-tests"
    strip "$bin"/*   # debug info makes them ~100 MB each; the device tool carries 64 MiB
    du -sh "$bin"
    exit 0
fi

events=${1:-1000000}
out=${OUT:-gpu-check-out}
work=$(mktemp -d)
mkdir -p "$out"
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "no nvidia-smi") | tee "$out/gpu.txt"

echo "== GPU tests"
"$bin/gpu-tests" --nocapture --test-threads 1 2>&1 | tee "$out/gpu-tests.log"

echo "== data: $events events"
"$bin/shardify-gen" "$work/src" --events "$events" --files 8 >/dev/null
"$bin/shardify" convert "$work/src" "$work/ds" --split train 2>&1 | tail -3 | tee "$out/convert.log"

echo "== example training loop on cuda:0"
"$bin/train_loop" "$work/ds" 2 cuda:0 2>&1 | tee "$out/train_loop.log"

echo "== shardbench, 1 ms simulated GPU step"
for workers in 2 8; do
    "$bin/shardbench" "$work/ds" --no-baselines --windows 1,16 --workers "$workers" \
        --device cuda:0 --simulate-compute 1 --json "$out/shardbench-w$workers-compute1.json" \
        2>&1 | tee "$out/shardbench-w$workers-compute1.log"
    "$bin/shardbench" "$work/ds" --no-baselines --windows 1,16 --workers "$workers" \
        --device cuda:0 --json "$out/shardbench-w$workers.json" \
        2>&1 | tee "$out/shardbench-w$workers.log"
done
rm -rf "$work"
