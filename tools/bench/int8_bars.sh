#!/usr/bin/env bash
# The int8 arm's bars that only some CPUs can show (issue 29: int8 >= 1.5x the best float arm on AVX-VNNI,
# AVX512-VNNI and AMX machines; the AVX2 bars), measured in one invocation on whatever CPU this is:
#   1. the CPU (model, flags that matter) and the kernels kev picks;
#   2. the GEMM bench on the 4B projection shapes at 94 and 1,518 rows, the best float arm beside int8
#      (on AMX once per next-panel prefetch schedule, `KEV_AMX_NEXT_PANEL=spread|burst|off`);
#   3. `kev bench backbone` on the 4B synthetic release, the best float arm beside int8, the native kernels,
#      and again at each lower int8 level the CPU also has (`KEV_ISA=avxvnni` on AVX-VNNI or AVX512-VNNI,
#      `KEV_ISA=avx2`; `KEV_ISA=neon` on an aarch64 CPU with I8MM), peers none (the peers' runs are `kev bench backbone --peers ...`, minutes each).
# Everything goes to OUT (default target/int8-bars/<UTC time>): the raw outputs, the JSON reports and
# summary.txt (the tables of every run), which is printed at the end. Needs ~9 GB of disk for the synthetic release if SYNTH has none.
#
#   tools/bench/int8_bars.sh [--synth DIR] [--out DIR] [--quick]
#
# --quick: the 0.8B shape, 94 tokens, one rep (checks the script and the machine in a few minutes; its
# figures are not the bars').
set -euo pipefail
cd "$(dirname "$0")/../.."

synth="" out="" quick=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --synth) synth="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "int8_bars: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [[ $quick -eq 1 ]]; then
    shape=0.8b lengths=94 reps=1 ms=94
else
    shape=4b lengths=94,1518 reps=2 ms=94,1518
fi
synth="${synth:-target/bench-cache/synth-$shape}"
out="${out:-target/int8-bars/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
log="$out/summary.txt"
# The summary file gets the headings and each run's tables; stderr shows the progress.
say() { echo "$*" >> "$log"; echo "$*" >&2; }
note() { cat >> "$log"; }

flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2)
has() { [[ " $flags " == *" $1 "* ]]; }
say "# int8 bars, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say "cpu: $(lscpu 2>/dev/null | grep -m1 -E '^Model name' | cut -d: -f2 | sed 's/^ *//') ($(nproc) cores)"
say "flags: $(for f in avx2 fma avx512f avx512bw avx512vl avx512_vnni avx_vnni avx512_bf16 amx_tile amx_int8 amx_bf16 asimddp i8mm; do has "$f" && printf '%s ' "$f"; done)"

# The best float arm: bf16 where the CPU has BF16 dot products (kev's default there), else fp32.
float=fp32
if has avx512_bf16 || has amx_bf16; then float=bf16; fi
levels=()
if has avx_vnni || { has avx512_vnni && has avx512vl; }; then levels+=(avxvnni); fi
if has avx2 && has fma; then levels+=(avx2); fi
# aarch64: the native level is `neoni8mm` (smmla) where the CPU has I8MM; `neon` (sdot) below it.
if has i8mm && has asimddp; then levels+=(neon); fi
say "arms: $float,int8; lower int8 levels also timed: ${levels[*]:-none}"

cargo build --release --locked -p kev 2>&1 | tail -1 >&2
kev=target/release/kev
if [[ ! -f "$synth/base/config.json" || ! -f "$synth/kev/adapter_config.json" ]]; then
    say "writing the $shape synthetic release to $synth"
    "$kev" synth --config "$shape" --out "$synth" > "$out/synth.log" 2>&1
fi

say ""
say "## GEMM, 4B projection shapes, rows $ms"
schedules=(default)
if has amx_int8; then schedules=(spread burst off); fi
for s in "${schedules[@]}"; do
    env_s=()
    [[ $s != default ]] && env_s=(KEV_AMX_NEXT_PANEL="$s")
    env "${env_s[@]}" KEV_BENCH_ARMS="$float,int8" KEV_BENCH_M="$ms" \
        cargo bench --locked -p kev-kernels --features peak --bench gemm > "$out/gemm-$s.txt" 2>&1
    say "### next-panel schedule: $s"
    grep -v -E '^\s*(Compiling|Finished|Running)' "$out/gemm-$s.txt" | tail -25 | note
done

backbone() { # name, then env assignments
    local name="$1"; shift
    env "$@" "$kev" bench backbone --base "$synth/base" --kev "$synth/kev" --arms "$float,int8" \
        --lengths "$lengths" --reps "$reps" --peers none --json "$out/backbone-$name.json" \
        > "$out/backbone-$name.txt" 2>&1
    say ""
    say "## backbone, kernels $name"
    grep -v -E 'INFO|WARN' "$out/backbone-$name.txt" | note
}
backbone native KEV_LOG_FORMAT=text
for l in "${levels[@]}"; do
    # These levels have no BF16 dot products: their float arm is fp32.
    if [[ $l == avx2 || $l == avxvnni || $l == neon ]]; then float=fp32; fi
    backbone "$l" KEV_ISA="$l"
done
say ""
say "(raw outputs and JSON reports in $out)"
cat "$log"
