#!/usr/bin/env bash
# Builds what `pip install shardify` needs without a Rust toolchain: an abi3 manylinux wheel
# (one wheel for every CPython >= 3.10 on x86_64 Linux with glibc >= 2.28) holding the native
# module and the `shardify` console script, plus an sdist, into OUTDIR.
#
#   bash tools/build-wheel.sh OUTDIR        # SHARDIFY_BUILD_VENV=DIR picks the build venv
#
# Linking goes through zig (the `ziglang` package from PyPI), which targets the manylinux
# glibc whatever this machine's is; `auditwheel show` then checks the policy. Needs cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash tools/build-wheel.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

venv="${SHARDIFY_BUILD_VENV:-target/wheel-venv}"
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "maturin>=1.9,<2" ziglang auditwheel
# maturin finds zig as `python3 -m ziglang`, with this venv's python3 first on PATH.
export PATH="$(cd "$venv/bin" && pwd):$PATH"

# The wheel is stripped: no debug information to generate (a shorter build).
export CARGO_PROFILE_RELEASE_DEBUG=0
rm -f "$out"/shardify-*.whl "$out"/shardify-*.tar.gz
maturin build --release --strip --zig --compatibility manylinux_2_28 --out "$out"
maturin sdist --out "$out"

wheel=$(ls "$out"/shardify-*.whl)
report=$(auditwheel show "$wheel")
echo "$report"
# The policy auditwheel reads from the wheel's symbols must be manylinux_2_28 or older. (The
# report is read whole first: `auditwheel show | grep -q` failed when grep, done at the first
# match, closed the pipe while auditwheel still wrote, under pipefail.)
grep -Eq 'manylinux_2_(1[0-9]|2[0-8])|manylinux201[0-4]' <<< "$report" \
    || { echo "build-wheel: $wheel is not manylinux_2_28 or older" >&2; exit 1; }
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1)); sdist: $(ls "$out"/shardify-*.tar.gz)"
