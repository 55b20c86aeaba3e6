#!/usr/bin/env bash
# The llama.cpp peer, from nothing: build llama-bench once (setup.sh llama), find the Python that runs the
# converter (setup.sh torch: KEV_BENCH_PYTHON or the bench venv), then convert (cached) and time (llama_cpp.py).
#
#   bash tools/bench/llama_cpp.sh --model BASE_DIR --tokens 94,380,1518 --runs 3 --out FILE.json
#
# Every argument goes to llama_cpp.py (see its --help); the cache root is KEV_BENCH_CACHE (default target/bench-cache in the repository).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${KEV_BENCH_CACHE:-$(cd "$(dirname "$0")/../.." && pwd)/target/bench-cache}
# setup.sh answers <llama dir>/build/bin (llama.cpp/ or, with KEV_BENCH_LLAMA_ISA=avx2, llama.cpp-avx2/).
BIN=$(bash "$HERE/setup.sh" llama)
PY=$(bash "$HERE/setup.sh" torch)
exec "$PY" "$HERE/llama_cpp.py" --llama-dir "$(dirname "$(dirname "$BIN")")" --gguf-cache "$CACHE/gguf" "$@"
