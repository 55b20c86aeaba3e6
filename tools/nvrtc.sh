#!/usr/bin/env bash
# Print a directory holding libnvrtc.so.13, fetching NVIDIA's `nvidia-cuda-nvrtc` wheel from PyPI into target/
# the first time. NVRTC compiles CUDA C without a GPU, so with it on LD_LIBRARY_PATH `cargo test -p kev-cuda`
# compiles every kernel for sm_90/sm_80 on a CPU machine (without it that test says it was skipped).
# Usage: export LD_LIBRARY_PATH="$(bash tools/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=13.5.37
DIR=target/nvrtc-$VERSION
LIB="$PWD/$DIR/nvidia/cu13/lib"
if [ ! -e "$LIB/libnvrtc.so.13" ]; then
  rm -rf "$DIR" && mkdir -p "$DIR"
  python3 -m venv "$DIR/venv" >&2
  "$DIR/venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$DIR/dl" \
    "nvidia-cuda-nvrtc==$VERSION" >&2
  python3 -m zipfile -e "$DIR"/dl/nvidia_cuda_nvrtc-*.whl "$DIR" >&2
  rm -rf "$DIR/venv" "$DIR/dl"
fi
test -e "$LIB/libnvrtc.so.13"
echo "$LIB"
