#!/usr/bin/env bash
# The whole test suite: the command the README tells a newcomer to run.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
awk '/^test result:/ {p+=$4; f+=$6; i+=$8} END {printf "summary: %d passed, %d failed, %d skipped\n", p, f, i}' "$log"
rm -f "$log"
exit "$status"
