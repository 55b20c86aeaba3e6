#!/usr/bin/env bash
# Build, on a machine with Rust, what a GPU machine without Rust runs: kev-cuda's device test binaries, copied
# to target/gpu/ under fixed names so a run can carry them (`carry: ["target/gpu"]`, plus the tracked
# fixtures/release that travels with the tree). Then run `bash tools/gpu/check.sh` there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p target/gpu
# kev-cuda's integration tests are one binary (`integration`); check.sh runs its device and backend modules.
for t in integration; do
  exe=$(cargo test -p kev-cuda --release --no-run --test "$t" --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$t" | tail -1)
  test -n "$exe" || { echo "no test binary for $t" >&2; exit 1; }
  cp "$exe" "target/gpu/kev-cuda-$t"
  echo "target/gpu/kev-cuda-$t"
done
