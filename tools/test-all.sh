#!/usr/bin/env bash
# Every test: the Rust crate's (`cargo test`), then the Python package's, built with pip
# (maturin) into a virtual environment made here and tested with pytest.
#
#   bash tools/test-all.sh          # SHARDIFY_VENV=DIR picks the venv (default .venv)
#
# The venv gets maturin, numpy, pytest, safetensors, torch (the registry's CUDA build; it
# runs without a GPU) and torch_geometric. With CI=true a missing torch fails the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --release

venv="${SHARDIFY_VENV:-.venv}"
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "maturin>=1.9,<2" numpy pyarrow pytest safetensors torch torch_geometric
# What a user runs: pip builds the wheel (maturin, release) from this checkout.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
    --no-deps .
"$venv/bin/python" -m pytest -q -rs python/tests
