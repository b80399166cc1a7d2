#!/usr/bin/env bash
# Builds what `pip install shardify` needs without a Rust toolchain: an abi3 manylinux wheel
# per target (one wheel for every CPython >= 3.10 on Linux with glibc >= 2.28) holding the
# native module and the `shardify` console script, plus an sdist, into OUTDIR.
#
#   bash tools/build-wheel.sh OUTDIR                # this machine's architecture
#   bash tools/build-wheel.sh OUTDIR aarch64        # ARM64: Grace Hopper, Graviton, Ampere
#   bash tools/build-wheel.sh OUTDIR x86_64 aarch64 # both
#
# SHARDIFY_BUILD_VENV=DIR picks the build venv. Linking goes through zig (the `ziglang`
# package from PyPI), which targets the manylinux glibc of any architecture whatever this
# machine's is: another architecture's wheel is cross-compiled (its Rust standard library
# added through rustup when missing). `auditwheel show` then checks each wheel's policy, and
# tools/check-wheel-arch.sh runs one under emulation. Needs cargo. A wheel replaces only the
# earlier one of its own architecture in OUTDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash tools/build-wheel.sh OUTDIR [x86_64|aarch64 ...]}"
shift
arches=("$@")
[[ ${#arches[@]} -gt 0 ]] || arches=("$(uname -m)")
for arch in "${arches[@]}"; do
    case "$arch" in
        x86_64|aarch64) ;;
        *) echo "build-wheel: architecture '$arch' not built (x86_64 or aarch64)" >&2; exit 2 ;;
    esac
done
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
for arch in "${arches[@]}"; do
    triple="$arch-unknown-linux-gnu"
    libdir=$(rustc --print target-libdir --target "$triple" 2>/dev/null || true)
    if [[ -z "$libdir" || ! -d "$libdir" ]]; then
        command -v rustup >/dev/null || {
            echo "build-wheel: no Rust standard library for $triple, and no rustup to add it" >&2
            exit 1
        }
        rustup target add "$triple"
    fi
    rm -f "$out"/shardify-*_"$arch".whl
    maturin build --release --strip --zig --compatibility manylinux_2_28 --target "$triple" \
        --out "$out"
    wheel=$(ls "$out"/shardify-*_"$arch".whl)
    report=$(auditwheel show "$wheel")
    echo "$report"
    # The policy auditwheel reads from the wheel's symbols must be manylinux_2_28 or older. (The
    # report is read whole first: `auditwheel show | grep -q` failed when grep, done at the
    # first match, closed the pipe while auditwheel still wrote, under pipefail.)
    grep -Eq "manylinux_2_(1[0-9]|2[0-8])_$arch|manylinux201[0-4]_$arch" <<< "$report" \
        || { echo "build-wheel: $wheel is not manylinux_2_28 or older for $arch" >&2; exit 1; }
    echo "wheel: $wheel ($(du -h "$wheel" | cut -f1))"
done
rm -f "$out"/shardify-*.tar.gz
maturin sdist --out "$out"
echo "sdist: $(ls "$out"/shardify-*.tar.gz)"
