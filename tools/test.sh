#!/usr/bin/env bash
# The whole test suite: the command the README tells a newcomer to run.
#
# 1. `cargo test --workspace` on the best kernels this CPU has (the engine's own kernel and parity tests
#    loop over every instruction set the CPU supports, whatever KEV_ISA says).
# 2. Where that best is above AVX2 (an AVX-512 machine), the crates whose tests run models (engine,
#    decide, accept, cli) again with KEV_ISA=avx2, so the AVX2 kernels carry every model-level test too.
# 3. With KEV_TEST_NEON=1 (CI sets it), the engine's kernel unit tests for aarch64 NEON, cross-compiled
#    and run under qemu-user (tools/neon-test.sh); skipped, and said so, where that cannot be set up.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
status=0
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

if grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    echo "== the model-level tests again on the AVX2 kernels (KEV_ISA=avx2)"
    # calibrate_mini fits temperatures on logits whose kernels the other model tests already cover on AVX2;
    # it decodes kev-mini's 2,400-request test split twelve times, so it runs once, in the first pass.
    KEV_ISA=avx2 cargo test --locked --no-fail-fast -p kev-engine -p kev-decide -p kev-accept -p kev \
        -- --skip calibration_on_the_kev_mini_test_split 2>&1 | tee -a "$log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if [[ "${KEV_TEST_NEON:-0}" == 1 ]]; then
    echo "== NEON kernels (aarch64, under qemu-user)"
    bash tools/neon-test.sh 2>&1 | tee -a "$log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

awk '/^test result:/ {p+=$4; f+=$6; i+=$8} /^skipped:/ {s+=1} END {printf "summary: %d passed, %d failed, %d skipped\n", p, f, i+s}' "$log"
rm -f "$log"
exit "$status"
