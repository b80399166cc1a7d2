#!/usr/bin/env bash
# Checks the build for another architecture on this machine, under qemu's user-mode
# emulation, in a Debian root of that architecture (aarch64 on an x86_64 machine: the wheel
# Grace Hopper, Graviton and Ampere machines install):
#   rust    the Rust tests, cross-compiled and run under emulation;
#   python  the Python tests against the wheel (tools/build-wheel.sh), installed there with
#           torch, torch_geometric and lightning and no Rust toolchain;
#   same    the fixtures converted there and here, every file the same byte for byte, and
#           epochs of batches (fixed-size, pulse and token budgets, padded, two ranks)
#           there and here, the same bytes.
#
#   bash tools/build-wheel.sh target/wheels aarch64   # the wheel the python and same parts run
#   bash tools/test-all.sh                            # .venv: this machine's wheel, for same
#   bash tools/check-arch.sh aarch64 [rust|python|same ...]   # default: all three
#
# Needs root (debootstrap, chroot, bind mounts) and Debian's packages debootstrap,
# qemu-user-static, binfmt-support and gcc-aarch64-linux-gnu (the linker of the Rust tests
# and of the Python tests' shardify-gen). The Debian root is made once, in target/arch-root/ARCH (SHARDIFY_ARCH_ROOT=DIR).
# Emulation is 10-50x slower than the machine: the parts take minutes to an hour. qemu's
# user mode can hang a process that forks while other threads run (the Python tests'
# fork-guard and copy tests fork): one run of the python part hung so, one passed.
#
# qemu's user mode does not do all a kernel does; the tests that fail under it for this
# machine's own architecture too (the x86_64 build run by qemu-x86_64, the same failure)
# are left out, each below with what qemu lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:?usage: bash tools/check-arch.sh aarch64 [rust|python|same ...]}"
shift
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(rust python same)
case "$arch" in
    aarch64) debian_arch=arm64 ;;
    *) echo "check-arch: architecture '$arch' not checked here (aarch64)" >&2; exit 2 ;;
esac
triple="$arch-unknown-linux-gnu"

# Left out of the Rust tests: qemu's madvise does nothing (no MADV_POPULATE_WRITE, no
# MADV_HUGEPAGE), so nothing is resident or asked for in huge pages from the start.
rust_skips=(
    device::staging::tests::large_buffers_start_on_a_huge_page_resident_and_zeroed
    a_dataset_that_fits_in_memory_asks_for_huge_pages_before_its_checksum_reads_a_shard
)
# Left out of the Python tests: qemu turns a fault on a mapped file's missing page into its
# own fatal signal without calling the guest's SIGBUS handler.
python_skips=(
    python/tests/test_errors.py::test_a_shard_truncated_while_read_is_named_before_the_process_ends
)
# Not run under emulation: the files whose tests train models, start process groups (DDP,
# Lightning), time benches or type-check, which emulation makes last hours or overrun their
# timeouts; none of them holds native code of its own.
python_not_run=(
    test_adapters_bench test_compile_check test_ddp test_docs test_examples test_gpu
    test_host_check test_kernel_compiles test_leaks test_legacy_consumers test_lightning
    test_peers test_types
)

if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-$arch ]]; then
    [[ -e /proc/sys/fs/binfmt_misc/register ]] \
        || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
    update-binfmts --enable "qemu-$arch" 2>/dev/null || true
    [[ -e /proc/sys/fs/binfmt_misc/qemu-$arch ]] || {
        echo "check-arch: the kernel runs no $arch programs (binfmt_misc): apt-get install" \
            "qemu-user-static binfmt-support" >&2
        exit 1
    }
fi

root="$(mkdir -p target && cd target && pwd)/arch-root/$arch"
root="${SHARDIFY_ARCH_ROOT:-$root}"
if [[ ! -x "$root/usr/bin/python3" ]]; then
    rm -rf "$root"
    mkdir -p "$(dirname "$root")"
    debootstrap --arch="$debian_arch" --variant=minbase --include=python3,python3-venv \
        bookworm "$root" http://deb.debian.org/debian
fi
mounted=()
unmount() {
    local at
    for at in "${mounted[@]}"; do umount "$at" || true; done
}
trap unmount EXIT
# Not /sys: torch's oneDNN reads this machine's CPU there as its own, and crashes.
for dir in proc dev dev/shm; do
    if ! mountpoint -q "$root/$dir"; then
        mount --bind "/$dir" "$root/$dir"
        mounted=("$root/$dir" "${mounted[@]}")
    fi
done
in_root() {
    chroot "$root" env -i HOME=/root PATH=/venv/bin:/usr/bin:/bin LANG=C.UTF-8 \
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
}
elapsed() { echo "== $arch: $1 took $((SECONDS - $2)) s"; }

# `cargo ARGS` for the architecture, linked by Debian's cross gcc; the programs it runs go
# through binfmt_misc, their libraries from the root.
cross_cargo() {
    local command=$1
    shift
    QEMU_LD_PREFIX="$root" CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
        cargo "$command" --release --target "$triple" --target-dir target/arch-build "$@"
}

check_rust() {
    local from=$SECONDS skips=() name
    for name in "${rust_skips[@]}"; do skips+=(--skip "$name"); done
    cross_cargo test -- "${skips[@]}"
    elapsed "the Rust tests" "$from"
}

# The checkout's tracked files, the real Kaggle sample where the tests look for it, and the
# wheel installed in the root's venv.
stage() {
    local wheel
    wheel=$(ls target/wheels/shardify-*_"$arch".whl 2>/dev/null) || {
        echo "check-arch: no $arch wheel in target/wheels (bash tools/build-wheel.sh" \
            "target/wheels $arch)" >&2
        exit 1
    }
    if [[ ! -x "$root/venv/bin/python" ]]; then
        # pip inside the root reaches the registry as this machine does.
        cp /etc/resolv.conf "$root/etc/resolv.conf"
        mkdir -p "$root/etc/ssl/certs"
        cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
        in_root python3 -m venv /venv
    fi
    in_root python -m pip install --quiet numpy pyarrow pytest safetensors torch \
        torch_geometric lightning
    rm -rf "$root/check" "$root/shared"
    mkdir -p "$root/check" "$root/shared/data"
    git ls-files -z | tar --null -T - -c | tar -x -C "$root/check"
    [[ ! -d ../shared/data/kaggle-sample ]] \
        || cp -r ../shared/data/kaggle-sample "$root/shared/data/"
    # The tests' generated datasets come from shardify-gen where cargo would have put it.
    cross_cargo build --bin shardify-gen
    mkdir -p "$root/check/target/release"
    cp "target/arch-build/$triple/release/shardify-gen" "$root/check/target/release/"
    cp "$wheel" "$root/check/"
    in_root python -m pip install --quiet --force-reinstall --no-deps \
        "/check/$(basename "$wheel")"
    echo "== $arch: $(in_root python -c \
        'import platform, shardify._native as n; print(platform.machine(), n.__file__)')"
}

check_python() {
    local from=$SECONDS deselect=() files=() file
    for name in "${python_skips[@]}"; do deselect+=(--deselect "$name"); done
    for file in python/tests/test_*.py; do
        [[ " ${python_not_run[*]} " == *" $(basename "$file" .py) "* ]] || files+=("$file")
    done
    in_root env SHARDIFY_TESTING_WHEEL=1 sh -c \
        "cd /check && python -m pytest -q -rs -p no:cacheprovider ${deselect[*]} ${files[*]}"
    elapsed "the Python tests" "$from"
}

check_same() {
    local native_python=.venv/bin/python here there file from=$SECONDS
    "$native_python" -c "import shardify" || {
        echo "check-arch: $native_python cannot import shardify (bash tools/test-all.sh" \
            "installs this machine's wheel into .venv)" >&2
        exit 1
    }
    cat > "$root/check/batches_digest.py" <<'PY'
"""Prints the batches' count and digest over several loaders' epochs of DATASET."""
import hashlib
import sys

import shardify

settings = [
    {"batch_events": 32},
    {"max_pulses": 2000, "pulse_cap": 64},
    {"max_tokens": 1024, "group_by_length": 64, "pad_to_multiple_of": 8},
    {"batch_events": 16, "layout": "padded", "max_doms": 32, "pulses_per_dom": 4},
    {"batch_events": 16, "rank": 1, "world": 2, "drop_last": True},
]
digest, batches = hashlib.sha256(), 0
for setting in settings:
    loader = shardify.Loader(sys.argv[1], output="numpy", seed=7, block_events=16,
                             window_blocks=4, **setting)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            batches += 1
            for name in sorted(batch):
                section = batch[name]
                digest.update(f"{name} {section.dtype} {section.shape}".encode())
                digest.update(section.tobytes())
print(batches, digest.hexdigest())
PY
    local options=(--split train --seed 42 --shard-size 64KiB)
    rm -rf target/arch-same "$root/check/ds"
    "$(dirname "$native_python")/shardify" convert fixtures/kaggle-mini target/arch-same \
        "${options[@]}" > /dev/null
    in_root sh -c "cd /check && shardify convert fixtures/kaggle-mini /check/ds ${options[*]}" \
        > /dev/null
    diff <(ls target/arch-same) <(ls "$root/check/ds")
    cmp <(sed "s|$PWD/|/check/|g" target/arch-same/manifest.json) \
        "$root/check/ds/manifest.json"   # its lineage names the sources by absolute path
    for file in target/arch-same/*.safetensors; do
        cmp "$file" "$root/check/ds/$(basename "$file")"
    done
    echo "== $arch: the conversion equals this machine's ($(ls target/arch-same | wc -l) files)"
    here=$("$native_python" "$root/check/batches_digest.py" target/arch-same)
    there=$(in_root python /check/batches_digest.py /check/ds)
    echo "== batches here ($(uname -m)): $here"
    echo "== batches there ($arch): $there"
    [[ "$here" == "$there" ]] || { echo "check-arch: the batches differ" >&2; exit 1; }
    elapsed "the same conversion and batches" "$from"
}

staged=false
for part in "${parts[@]}"; do
    case "$part" in
        rust) check_rust ;;
        python|same)
            $staged || stage
            staged=true
            "check_$part" ;;
        *) echo "check-arch: no part '$part' (rust, python, same)" >&2; exit 2 ;;
    esac
done
echo "== $arch: checked (${parts[*]})"
