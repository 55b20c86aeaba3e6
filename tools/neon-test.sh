#!/usr/bin/env bash
# The kernels' unit tests (kev-kernels, and the engine's GDN chunk) on aarch64 NEON: cross-compiled for aarch64-unknown-linux-gnu and run
# under qemu-user, so the NEON instantiation of every generic kernel is executed, not only compiled.
# Installs what it needs (rustup's aarch64 std, Debian's cross gcc and qemu-user) when it is missing;
# where that cannot be done it prints `skipped: …` and exits 0 (a skip is never counted as a pass).
set -uo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
skip() { echo "skipped: NEON kernel tests: $*"; exit 0; }

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    rustup target add "$target" >/dev/null 2>&1 || skip "rustup could not add the $target standard library"
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user) >/dev/null 2>&1 ||
            skip "could not install gcc-aarch64-linux-gnu and qemu-user"
    else
        skip "needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu, qemu-user)"
    fi
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
# Every kernel (GEMM, matrix product, vector math, the Simd core, the peak loops) against plain arithmetic,
# on Scalar and NEON, then the engine's GDN chunk the same way.
cargo test --locked --target "$target" -p kev-kernels --features peak --lib || exit 1
exec cargo test --locked --target "$target" -p kev-engine --lib -- gdn::
