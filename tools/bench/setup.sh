#!/usr/bin/env bash
# Set up the peers that `kev bench` compares against, cached under the bench cache so a second run is quick.
#
#   bash tools/bench/setup.sh torch   # print the Python interpreter that runs the torch peers (creating its venv)
#   bash tools/bench/setup.sh llama   # print the directory holding llama-bench (building llama.cpp once)
#   bash tools/bench/setup.sh all     # both, two lines
#
# Environment:
#   KEV_BENCH_CACHE   cache root (default target/bench-cache in the repository)
#   KEV_BENCH_PYTHON  an existing interpreter with torch, transformers, peft, safetensors (skips the ~5 GB venv)
#   KEV_BENCH_TORCH_INDEX  an extra pip index for torch (e.g. a CPU-only wheel index); default: PyPI only
#   KEV_BENCH_JOBS    parallel compile jobs for llama.cpp (default: nproc)
#   KEV_BENCH_LLAMA_ISA  `native` (default: -DGGML_NATIVE=ON) or `avx2` (AVX2 + FMA + F16C, no AVX-512: what
#                     llama.cpp runs on an AVX2-only CPU; built into a separate llama.cpp-avx2/ cache dir)
#
# Progress goes to stderr; stdout carries only the answer lines, so callers can capture them.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${KEV_BENCH_CACHE:-$(cd "$(dirname "$0")/../.." && pwd)/target/bench-cache}
LLAMA_CPP_PYTHON_VERSION=0.3.36
# The llama.cpp commit vendored by llama-cpp-python 0.3.36 (its CHANGELOG); recorded, not checked out.
LLAMA_CPP_COMMIT=0c1e57098

log() { echo "[bench setup] $*" >&2; }
die() { echo "[bench setup] error: $*" >&2; exit 1; }

# A python3 (>= 3.10) to create venvs with.
host_python() {
    local py
    for py in python3 python3.12 python3.11 python3.10; do
        if command -v "$py" >/dev/null 2>&1 &&
            "$py" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            command -v "$py"
            return 0
        fi
    done
    die "no python3 >= 3.10 with the venv module on PATH (Debian: apt-get install python3-venv)"
}

torch_ok() {
    "$1" - <<'PY' >/dev/null 2>&1
import torch, transformers, peft, safetensors, numpy  # noqa: F401
PY
}

setup_torch() {
    if [[ -n "${KEV_BENCH_PYTHON:-}" ]]; then
        [[ -x "$KEV_BENCH_PYTHON" ]] || die "KEV_BENCH_PYTHON=$KEV_BENCH_PYTHON is not an executable"
        torch_ok "$KEV_BENCH_PYTHON" ||
            die "KEV_BENCH_PYTHON=$KEV_BENCH_PYTHON cannot import torch, transformers, peft, safetensors and numpy"
        echo "$KEV_BENCH_PYTHON"
        return 0
    fi
    local venv="$CACHE/venv" stamp="$CACHE/venv/.kev-bench-ok"
    if [[ -f "$stamp" ]] && cmp -s "$stamp" "$HERE/requirements.txt" && torch_ok "$venv/bin/python"; then
        echo "$venv/bin/python"
        return 0
    fi
    log "creating the bench venv at $venv (torch, transformers, peft: a few GB, several minutes)"
    mkdir -p "$CACHE"
    [[ -x "$venv/bin/python" ]] || "$(host_python)" -m venv "$venv"
    local extra=()
    [[ -n "${KEV_BENCH_TORCH_INDEX:-}" ]] && extra=(--extra-index-url "$KEV_BENCH_TORCH_INDEX")
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet "${extra[@]}" -r "$HERE/requirements.txt" >&2 ||
        die "pip install -r $HERE/requirements.txt failed"
    torch_ok "$venv/bin/python" || die "the bench venv at $venv cannot import its packages"
    cp "$HERE/requirements.txt" "$stamp"
    echo "$venv/bin/python"
}

# cmake >= 3.14 and scikit-build-core (so `pip download` can read the sdist's metadata without build isolation,
# which would otherwise spend minutes installing build backends) live in a small tools venv.
tools_venv() {
    local venv="$CACHE/buildtools"
    if [[ ! -x "$venv/bin/cmake" ]] || ! "$venv/bin/python" -c 'import scikit_build_core' 2>/dev/null; then
        log "creating the build-tools venv at $venv (cmake, scikit-build-core)"
        mkdir -p "$CACHE"
        [[ -x "$venv/bin/python" ]] || "$(host_python)" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
        "$venv/bin/python" -m pip install --quiet "cmake>=3.25,<4" "scikit-build-core>=0.10" >&2 ||
            die "could not install cmake and scikit-build-core from PyPI"
    fi
    echo "$venv"
}

setup_llama() {
    local isa=${KEV_BENCH_LLAMA_ISA:-native} suffix="" isa_flags=(-DGGML_NATIVE=ON)
    case "$isa" in
    native) ;;
    avx2)
        suffix="-avx2"
        isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
            -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
            -DGGML_AVX_VNNI=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF)
        ;;
    *) die "KEV_BENCH_LLAMA_ISA=$isa: expected native or avx2" ;;
    esac
    local root="$CACHE/llama.cpp$suffix" bin="$CACHE/llama.cpp$suffix/build/bin"
    local stamp="$root/build.ok"
    if [[ -f "$stamp" && -x "$bin/llama-bench" ]]; then
        echo "$bin"
        return 0
    fi
    command -v c++ >/dev/null 2>&1 || die "no C++ compiler on PATH (Debian: apt-get install g++)"
    command -v make >/dev/null 2>&1 || command -v ninja >/dev/null 2>&1 || die "neither make nor ninja on PATH"
    local tools
    tools=$(tools_venv)
    mkdir -p "$root/dl"
    local sdist="$root/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        log "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (~77 MB) from PyPI"
        "$tools/bin/python" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
            -d "$root/dl" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2 ||
            die "pip download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed"
    fi
    local src="$root/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    if [[ ! -f "$src/CMakeLists.txt" ]]; then
        log "unpacking $sdist"
        rm -rf "$root/src"
        mkdir -p "$root/src"
        tar -xzf "$sdist" -C "$root/src"
        [[ -f "$src/CMakeLists.txt" ]] || die "the sdist has no vendor/llama.cpp"
    fi
    local jobs=${KEV_BENCH_JOBS:-$(nproc)}
    log "building llama-bench and test-backend-ops from llama.cpp@$LLAMA_CPP_COMMIT with -j$jobs (~4 min on 2 cores)"
    "$tools/bin/cmake" -S "$src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release "${isa_flags[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2 || die "cmake configure failed"
    "$tools/bin/cmake" --build "$root/build" -j "$jobs" --target llama-bench test-backend-ops >&2 ||
        die "cmake build failed"
    [[ -x "$bin/llama-bench" ]] || die "the build produced no $bin/llama-bench"
    {
        echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (vendored llama.cpp $LLAMA_CPP_COMMIT), isa $isa"
        echo "src $src"
        "$bin/llama-bench" --help 2>/dev/null | head -n 1 || true
    } >"$stamp"
    echo "$bin"
}

case "${1:-all}" in
torch) setup_torch ;;
llama) setup_llama ;;
all)
    setup_torch
    setup_llama
    ;;
*) die "usage: setup.sh [torch|llama|all]" ;;
esac
