#!/usr/bin/env bash
# The whole test suite: the command the README tells a newcomer to run.
#
# 1. Every test of the workspace on the best kernels this CPU has (the engine's kernel and parity tests loop
#    over every instruction set the CPU supports, whatever KEV_ISA says).
# 2. Where that best is above AVX2 (an AVX-512 machine), the model-level tests (engine and decide integration
#    tests, the binary's) again with KEV_ISA=avx2, so the AVX2 kernels carry them too. Not on an AVX2-only CPU:
#    there the first pass already ran them on AVX2.
# 3. With KEV_TEST_NEON=1 (CI sets it), the engine's kernel unit tests for aarch64 NEON, cross-compiled and run
#    under qemu-user (tools/neon-test.sh); skipped, and said so, where that cannot be set up.
#
# Runs under cargo-nextest (all tests of all binaries scheduled together over the cores; `.config/nextest.toml`)
# where it is installed, else plain `cargo test`. Tests that print `skipped: …` could not run here: they are listed
# and counted as skipped, never as passed.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
passed=0 failed=0 skipped=0
t_start=$(date +%s)

# The AVX2 pass: the crates whose tests run models, but not the kernel unit tests (they loop over every
# instruction set themselves) and not calibrate_mini (it fits temperatures on logits whose kernels the other model
# tests already cover on AVX2, and decodes kev-mini's 2,400-request test split several times), nor kev-mini's
# bf16 fidelity test (AVX2 has no bf16 dot product: the arm widens to f32 FMAs, three times the first pass's
# cost; the GEMM unit tests hold the AVX2 bf16 kernel to its error bound on every shape), nor the decide-output
# record (it sets KEV_ISA itself, to every set the CPU has),
# nor the 9B/4B adapter-pairing refusal (it runs no kernel), nor the 9B shape's arms (2-4 minutes natively; the
# kernels are shape-generic and the 4B/0.8B tests hold them on AVX2). kev-mini's exact (LoRA unmerged) fp32 test
# is in it: 44 s on AVX2 since the fp32 microkernel's k step is inline again (it was six minutes).
avx2_pass=0
if grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    avx2_pass=1
fi

count() { # junit log [--filtered]
    local out
    out=$(python3 tools/test_summary.py "$@")
    echo "$out" | grep '^skipped:' || true
    read -r p f s < <(echo "$out" | sed -n 's/^counts: //p')
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

if cargo nextest --version >/dev/null 2>&1; then
    junit=target/nextest/default/junit.xml
    log=$(mktemp)
    echo "== cargo nextest run --workspace"
    cargo nextest run --workspace --locked --no-fail-fast 2>&1 | tee "$log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    count "$junit" "$log"
    echo "(first pass $(( $(date +%s) - t_start )) s)"
    if [[ $avx2_pass -eq 1 ]]; then
        t1=$(date +%s)
        echo "== the model-level tests again on the AVX2 kernels (KEV_ISA=avx2)"
        KEV_ISA=avx2 cargo nextest run --workspace --locked --no-fail-fast -E \
            '(package(kev-engine) | package(kev-decide) | package(kev)) & kind(test) & not test(/calibration_on_the_kev_mini_test_split|bf16_compute_and_merged_bf16|decide_outputs_are_byte_identical|a_9b_adapter_on_the_4b_base|the_9b_shape_loads_and_decides/)' \
            2>&1 | tee "$log"
        [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
        count "$junit" "$log" --filtered
        echo "(AVX2 pass $(( $(date +%s) - t1 )) s)"
    fi
    rm -f "$log"
else
    echo "cargo-nextest is not installed: running plain cargo test (slower: one test binary at a time)"
    log=$(mktemp)
    cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    if [[ $avx2_pass -eq 1 ]]; then
        echo "== the model-level tests again on the AVX2 kernels (KEV_ISA=avx2)"
        KEV_ISA=avx2 cargo test --locked --no-fail-fast -p kev-engine -p kev-decide -p kev --test integration \
            -- --skip calibration_on_the_kev_mini_test_split --skip bf16_compute_and_merged_bf16 --skip decide_outputs_are_byte_identical --skip a_9b_adapter_on_the_4b_base --skip the_9b_shape_loads_and_decides 2>&1 | tee -a "$log"
        [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    fi
    read -r passed failed skipped < <(awk '/^test result:/ {p+=$4; f+=$6; i+=$8} /^skipped:/ {s+=1} \
        END {print p - s, f, i + s}' "$log")
    grep '^skipped:' "$log" || true
    rm -f "$log"
fi

if [[ "${KEV_TEST_NEON:-0}" == 1 ]]; then
    t1=$(date +%s)
    echo "== NEON kernels (aarch64, under qemu-user)"
    log=$(mktemp)
    bash tools/neon-test.sh 2>&1 | tee "$log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    read -r p f i < <(awk '/^test result:/ {p+=$4; f+=$6; i+=$8} END {print p+0, f+0, i+0}' "$log")
    s=$(grep -c '^skipped:' "$log")
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + i + s))
    rm -f "$log"
    echo "(NEON $(( $(date +%s) - t1 )) s)"
fi

echo "summary: $passed passed, $failed failed, $skipped skipped ($(( $(date +%s) - t_start )) s)"
exit "$status"
