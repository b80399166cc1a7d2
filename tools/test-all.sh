#!/usr/bin/env bash
# Every test: the Rust crate's (`cargo test`), then the Python package's, run against the
# wheel users install (tools/build-wheel.sh) in a virtual environment whose PATH holds no
# cargo or rustc, so a file missing from the wheel fails here.
#
#   bash tools/test-all.sh          # SHARDIFY_VENV=DIR picks the test venv (default .venv)
#
# The venv gets numpy, pyarrow, pytest, safetensors, mypy, torch (the registry's CUDA build;
# it runs without a GPU), torch_geometric and lightning. With CI=true a missing torch or
# lightning fails the tests. A second venv (target/numpy1-venv) holds numpy 1.x and the
# wheel alone, for the tests of older consumers. The crate is also checked for aarch64 and
# its API docs built, warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."

# CI allows the whole run 25 minutes on 2 cores. The aarch64 check and the API docs run in
# the background, niced, where a core is idle: beside the test venvs' downloads and pytest
# (which keeps about one core busy). The downloads themselves stay in the foreground: beside
# a cold `cargo test`, unpacking torch's 6 GB slowed it by about 190 s, more than the 165 s
# it hid (a cold run took 1507 s). Each step's time is printed at the end, so the step that
# grows is visible in the log.
step_times=()
step_start=$SECONDS
step_done() {
    step_times+=("$1: $((SECONDS - step_start)) s")
    step_start=$SECONDS
}

# The background job (the aarch64 check and the API docs, below) runs in its own process
# group, so that an exit (a failed step, an interrupt) stops it whole.
checks_pid=""
on_exit() {
    local status=$?
    [[ -z "$checks_pid" ]] || kill -- "-$checks_pid" 2>/dev/null || true
    printf "test-all: %s\n" "${step_times[@]}" "total: $SECONDS s (exit $status)" >&2
}
trap on_exit EXIT

cargo test --release
step_done "cargo test"

# The wheel and the sdist (abi3, manylinux_2_28, linked through zig).
export SHARDIFY_BUILD_VENV="${SHARDIFY_BUILD_VENV:-target/wheel-venv}"
bash tools/build-wheel.sh target/wheels
step_done "wheel and sdist"

# The crate compiles for aarch64, the other wheel's architecture, without a warning: code
# for one architecture (intrinsics, inline assembly) must say what the others do. Checked,
# not built (no linker needed); tools/check-arch.sh runs that build's tests under emulation.
# Its C dependency (zstd-sys) compiles through the wheel build's zig, as the aarch64 wheel's
# does: CI has no aarch64 gcc (the check failed there for want of aarch64-linux-gnu-gcc).
aarch64_check() {
    local zig="target/zig-aarch64" bin tool target
    if ! rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1; then
        echo "test-all: rustup cannot add aarch64-unknown-linux-gnu here: the aarch64 check" \
            "is skipped"
        return 0
    fi
    bin="$(cd "$SHARDIFY_BUILD_VENV/bin" && pwd)"
    mkdir -p "$zig"
    for tool in cc ar; do
        target=""
        [[ $tool == cc ]] && target="-target aarch64-linux-gnu.2.28"
        printf '%s\n' '#!/bin/sh' \
            "export CARGO_ZIGBUILD_ZIG_COMMAND='$bin/python3' CARGO_ZIGBUILD_ZIG_COMMAND_ARGS='-m ziglang'" \
            "exec '$bin/maturin' zig $tool -- $target \"\$@\"" > "$zig/$tool"
        chmod +x "$zig/$tool"
    done
    CC_aarch64_unknown_linux_gnu="$PWD/$zig/cc" AR_aarch64_unknown_linux_gnu="$PWD/$zig/ar" \
        RUSTFLAGS="-D warnings" cargo check --all-targets --target aarch64-unknown-linux-gnu
}
# The API docs build with every intra-doc link resolved (a link to a private item renders
# as dead text): warnings are errors here.
api_docs() {
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --package shardify
}
checks_log="target/aarch64-check-and-docs.log"
set -m
(
    renice -n 10 -p "$BASHPID" >/dev/null 2>&1 || true
    aarch64_check
    api_docs
    echo "($((SECONDS - step_start)) s in the background)"
) > "$checks_log" 2>&1 &
checks_pid=$!
set +m

venv="${SHARDIFY_VENV:-.venv}"
# A venv whose making was cut short (an interrupted run) lacks pip: made again.
make_venv() {  # DIR
    "$1/bin/python" -m pip --version >/dev/null 2>&1 || python3 -m venv "$1"
}
make_venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    numpy pyarrow pytest safetensors mypy torch torch_geometric lightning
wheel=(target/wheels/shardify-*_"$(uname -m)".whl)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
    --no-deps "${wheel[@]}"

# A second venv with numpy 1.x and no torch, which the package supports too (numpy >= 1.22):
# python/tests/test_legacy_consumers.py runs the numpy-facing API in it
# (SHARDIFY_NUMPY1_PYTHON).
# numpy 1.x has no wheels for Python 3.13 and later: there the test skips (fails with CI=true).
numpy1="target/numpy1-venv"
numpy1_python=""
make_venv "$numpy1"
if "$numpy1/bin/python" -m pip install --quiet --disable-pip-version-check \
        --only-binary=:all: "numpy<2" \
    && "$numpy1/bin/python" -m pip install --quiet --disable-pip-version-check \
        --force-reinstall --no-deps "${wheel[@]}"; then
    numpy1_python="$numpy1/bin/python"
else
    echo "test-all: no numpy 1.x for this Python; the older-numpy test cannot run" >&2
fi
step_done "test venvs"

# PATH without the Rust toolchain: the package must work from the wheel alone. The slowest
# tests are listed at the end, beside the step times.
rust_free_path=""
IFS=: read -ra dirs <<< "$PATH"
for dir in "${dirs[@]}"; do
    if [[ -n "$dir" && ! -x "$dir/cargo" && ! -x "$dir/rustc" ]]; then
        rust_free_path="${rust_free_path:+$rust_free_path:}$dir"
    fi
done
PATH="$rust_free_path" SHARDIFY_TESTING_WHEEL=1 SHARDIFY_NUMPY1_PYTHON="$numpy1_python" \
    "$venv/bin/python" -m pytest -q -rs --durations=15 python/tests
step_done "pytest"

checks_status=0
wait "$checks_pid" || checks_status=$?
cat "$checks_log" >&2
[[ $checks_status -eq 0 ]] || {
    echo "test-all: the aarch64 check or the API docs failed (exit $checks_status)" >&2
    exit 1
}
step_done "aarch64 check and API docs (beyond pytest)"
