#!/usr/bin/env bash
# On the GPU machine, from the repository root: every device check of kev-cuda in one run (built beforehand by
# tools/gpu/build.sh). Prints the device, each test's figures (--nocapture) and a one-line verdict per binary.
# NVRTC and cuBLAS come from the machine's CUDA toolkit (or its torch wheel's nvidia-* libraries).
set -uo pipefail
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
dirs = {os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "*", "lib", "lib*.so*"))}
print(" ".join(sorted(dirs)))
PY
)
for lib in /usr/local/cuda/lib64 $libs; do
  [ -d "$lib" ] && LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
# A device that does not open fails the tests here instead of skipping them.
export KEV_REQUIRE_CUDA=1
status=0
for t in device backend; do
  echo "== kev-cuda $t"
  if ./target/gpu/kev-cuda-integration "$t":: --nocapture --test-threads=1; then echo "PASS $t"; else echo "FAIL $t"; status=1; fi
done
exit $status
