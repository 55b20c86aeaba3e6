#!/usr/bin/env bash
# Set up the peers that `kev bench` compares against, cached under the bench cache so a second run is quick.
#
#   bash tools/bench/setup.sh torch   # print the Python interpreter that runs the torch peers (creating its venv)
#   bash tools/bench/setup.sh llama   # print the directory holding llama-bench + llama-quantize (building once)
#   bash tools/bench/setup.sh ik-llama  # the same for ik_llama.cpp's llama-bench (from ik-llama-cpp-python)
#   bash tools/bench/setup.sh all     # all three, three lines
#
# Environment:
#   KEV_BENCH_CACHE   cache root (default target/bench-cache in the repository)
#   KEV_BENCH_PYTHON  an existing interpreter with torch, transformers, peft, safetensors (skips the ~5 GB venv)
#   KEV_BENCH_TORCH_INDEX  an extra pip index for torch (e.g. a CPU-only wheel index); default: PyPI only
#   KEV_BENCH_JOBS    parallel compile jobs for the C++ builds (default: nproc)
#   KEV_BENCH_LLAMA_ISA  `native` (default: -DGGML_NATIVE=ON) or `avx2` (AVX2 + FMA + F16C, no AVX-512: what
#                     the build runs on an AVX2-only CPU; built into separate llama.cpp-avx2/, ik_llama.cpp-avx2/
#                     cache dirs). Both llama.cpp and ik_llama.cpp follow it.
#
# Progress goes to stderr; stdout carries only the answer lines, so callers can capture them.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${KEV_BENCH_CACHE:-$(cd "$(dirname "$0")/../.." && pwd)/target/bench-cache}
LLAMA_CPP_PYTHON_VERSION=0.3.36
# The llama.cpp commit vendored by llama-cpp-python 0.3.36 (its CHANGELOG); recorded, not checked out.
LLAMA_CPP_COMMIT=0c1e57098
IK_LLAMA_CPP_PYTHON_VERSION=0.1.5
# The ik_llama.cpp commit vendored by ik-llama-cpp-python 0.1.5: the sdist carries no git metadata; every file of
# its src/, ggml/, common/, examples/ and include/ equals that commit's (2026-04-13), none of its neighbours'.
IK_LLAMA_COMMIT=55d3c05bf

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

# The instruction-set flags of a llama.cpp-family build: `native` (-march=native) or `avx2` (AVX2 + FMA + F16C and
# nothing wider: what the build runs on an AVX2-only CPU). Both forks name these options alike; mainline's extra
# ones (AVX-VNNI, the dynamic CPU variants) are unknown to ik_llama.cpp's CMake and only warned about there.
isa_flags() {
    case "$1" in
    native) echo "-DGGML_NATIVE=ON" ;;
    avx2)
        echo "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF" \
            "-DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF" \
            "-DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF"
        ;;
    esac
}

# Build a llama.cpp-family source vendored by a PyPI sdist, once per ISA, and print its build/bin directory.
#   build_vendored NAME PYPI_NAME VERSION COMMIT VENDOR_DIR "TARGETS" [EXTRA CMAKE FLAGS...]
# NAME is the cache dir (NAME/ or NAME-avx2/); VENDOR_DIR the source's path inside the sdist.
build_vendored() {
    local name=$1 pypi=$2 version=$3 commit=$4 vendor=$5 targets=$6
    shift 6
    local isa=${KEV_BENCH_LLAMA_ISA:-native} suffix=""
    [[ "$isa" == native || "$isa" == avx2 ]] || die "KEV_BENCH_LLAMA_ISA=$isa: expected native or avx2"
    local flags
    read -r -a flags <<<"$(isa_flags "$isa")"
    [[ "$isa" == native ]] || suffix="-$isa"
    local root="$CACHE/$name$suffix" bin="$CACHE/$name$suffix/build/bin"
    local stamp="$root/build.ok" t missing=""
    for t in $targets; do [[ -x "$bin/$t" ]] || missing="$missing $t"; done
    if [[ -f "$stamp" && -z "$missing" ]]; then
        echo "$bin"
        return 0
    fi
    command -v c++ >/dev/null 2>&1 || die "no C++ compiler on PATH (Debian: apt-get install g++)"
    command -v make >/dev/null 2>&1 || command -v ninja >/dev/null 2>&1 || die "neither make nor ninja on PATH"
    local tools
    tools=$(tools_venv)
    mkdir -p "$root/dl"
    local dist=${pypi//-/_}
    local sdist="$root/dl/$dist-$version.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        log "downloading the $pypi $version sdist from PyPI"
        "$tools/bin/python" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
            -d "$root/dl" "$pypi==$version" >&2 ||
            die "pip download $pypi==$version failed"
    fi
    local src="$root/src/$dist-$version/$vendor"
    if [[ ! -f "$src/CMakeLists.txt" ]]; then
        log "unpacking $sdist"
        rm -rf "$root/src"
        mkdir -p "$root/src"
        tar -xzf "$sdist" -C "$root/src"
        [[ -f "$src/CMakeLists.txt" ]] || die "the sdist has no $vendor"
    fi
    # ik-llama-cpp-python's sdist leaves out common/cmake/build-info-gen-cpp.cmake, the script that writes
    # common/build-info.cpp from git: write that file as it would (the commit recorded above; llama-bench reports
    # it as build_commit), so make finds the output present and newer than its template.
    local info="$src/common/build-info.cpp"
    if [[ -f "$info.in" && ! -f "$src/common/cmake/build-info-gen-cpp.cmake" && ! -f "$info" ]]; then
        sed -e "s|@BUILD_NUMBER@|0|" -e "s|@BUILD_COMMIT@|$commit|" \
            -e "s|@BUILD_COMPILER@|$(c++ --version | head -n 1)|" -e "s|@BUILD_TARGET@|$(c++ -dumpmachine)|" \
            "$info.in" >"$info"
    fi
    local jobs=${KEV_BENCH_JOBS:-$(nproc)}
    log "building $targets of $name@$commit ($isa) with -j$jobs (minutes: several on 2 cores)"
    "$tools/bin/cmake" -S "$src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF "$@" >&2 ||
        die "cmake configure failed"
    # shellcheck disable=SC2086
    "$tools/bin/cmake" --build "$root/build" -j "$jobs" --target $targets >&2 || die "cmake build failed"
    for t in $targets; do [[ -x "$bin/$t" ]] || die "the build produced no $bin/$t"; done
    {
        echo "$pypi $version (vendored $name $commit), isa $isa"
        echo "src $src"
        echo "flags ${flags[*]} $*"
    } >"$stamp"
    echo "$bin"
}

# Mainline: llama-bench, test-backend-ops (kernel figures), llama-quantize (the Q4_K_M GGUF every llama-family
# peer times is quantised by it from the BF16 conversion).
setup_llama() {
    build_vendored llama.cpp llama-cpp-python "$LLAMA_CPP_PYTHON_VERSION" "$LLAMA_CPP_COMMIT" vendor/llama.cpp \
        "llama-bench test-backend-ops llama-quantize" -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF
}

# ik_llama.cpp: llama-bench only (it lives under examples/ there). Its IQK flash-attention kernels stay on (its
# default, as a user runs it); GGML_IQK_FA_ALL_QUANTS (every quantised K/V type: minutes more of compiling) is
# off, since llama-bench's KV cache is F16.
setup_ik_llama() {
    build_vendored ik_llama.cpp ik-llama-cpp-python "$IK_LLAMA_CPP_PYTHON_VERSION" "$IK_LLAMA_COMMIT" \
        vendor/ik_llama.cpp "llama-bench" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
        -DGGML_IQK_FA_ALL_QUANTS=OFF -DGGML_CCACHE=OFF
}

case "${1:-all}" in
torch) setup_torch ;;
llama) setup_llama ;;
ik-llama) setup_ik_llama ;;
all)
    setup_torch
    setup_llama
    setup_ik_llama
    ;;
*) die "usage: setup.sh [torch|llama|ik-llama|all]" ;;
esac
