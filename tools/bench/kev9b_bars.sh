#!/usr/bin/env bash
# Issue 54's bars for Kev-9B, measured in one invocation on whatever CPU this is (run it on a quiet machine):
#   1. the CPU (model, flags), load average, free memory and the busiest processes, before and after;
#   2. the 9B synthetic release (`kev synth --config 9b`: every width real, 32 layers, untied; ≈ 18 GB), made if
#      SYNTH has none;
#   3. `kev bench backbone` at 94 / 380 / 1,518 tokens, kev's arms (the best float arm and int8) with llama.cpp
#      (BF16, Q8_0) and ik_llama.cpp (Q8_0 and Q4_K_M, run-time repacking) on the same weights in the same run:
#      once on the native kernels, once with KEV_ISA=avx2 (fp32 and int8; the peers are built and run as AVX2-only
#      then, `kev bench` caps them itself);
#   4. `kev bench decide`, case 1q-json-190 (one question on a 190-token JSON state, a new state each time), ≥ 10
#      timed requests per arm, natively and on AVX2;
#   5. peak RSS of `kev serve` per arm (int8, bf16, fp32) while it serves 8 requests of ≈ 1,500 tokens with
#      distinct states (the state cache at its default budget, which the report states);
#   6. tools/bench/kev9b_summary.py: the bars (kev's fastest arm ≥ 1.5× each peer's fastest 8/16-bit run and
#      ≥ 1.0× ik_llama.cpp's fastest run at every length; decide under 3.94 s; RSS ≤ 11 / 19 / 19 GiB).
# Everything goes to OUT (default target/kev9b-bars/<UTC time>): raw outputs, JSON reports, summary.txt, bars.json.
#
#   tools/bench/kev9b_bars.sh [--synth DIR] [--out DIR] [--quick] [--skip-avx2] [--skip-serve] [--layers N]
#                             [--lengths L,L] [--reps R] [--peers P,P]
#
# Needs: ≈ 18 GB of disk for the release and ≈ 34 GB for the GGUFs (BF16 17.9 GB, Q8_0 9.5 GB, Q4_K_M 5.7 GB;
# under KEV_BENCH_CACHE, default target/bench-cache), ≈ 20 GiB of free memory (the bf16 arm and llama.cpp's BF16
# run each map ≈ 15 GiB; they run one after the other), and time: 2 h 14 min on a 2-core Sapphire Rapids class Xeon
# (2026-12-07, peers already built, the three GGUF conversions included: ≈ 45 min native, ≈ 65 min AVX2 — most of
# it the peers' 1,518-token rows, a warm-up and three repetitions each — 25 min serve), plus the first build of
# llama.cpp and ik_llama.cpp (≈ 15 min each, twice: native and AVX2).
# --quick: 94 tokens only, one repetition, no serve (checks the whole chain in about an hour once the peers and
# GGUFs are cached; its figures are not the bars'). --layers 4 runs the same chain on the 9B shape's first four
# layers (a 5.8 GB release, GGUFs ≈ 11 GB: the end-to-end check on a small disk; its figures are not the 9B's).
# --lengths / --reps / --peers override the backbone rows (a session short of hours measures a subset, and says so:
# the summary marks a length it did not run as unmeasured, never as met); --peers as `kev bench --peers` takes it.
set -euo pipefail
cd "$(dirname "$0")/../.."

synth="" out="" quick=0 skip_avx2=0 skip_serve=0 layers="" lengths_arg="" reps_arg="" peers_arg=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --synth) synth="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        --skip-avx2) skip_avx2=1; shift ;;
        --skip-serve) skip_serve=1; shift ;;
        --layers) layers="$2"; shift 2 ;;
        --lengths) lengths_arg="$2"; shift 2 ;;
        --reps) reps_arg="$2"; shift 2 ;;
        --peers) peers_arg="$2"; shift 2 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "kev9b_bars: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [[ $quick -eq 1 ]]; then
    lengths=94 reps=1 decide_reps=3 skip_serve=1
else
    lengths=94,380,1518 reps=3 decide_reps=10
fi
lengths="${lengths_arg:-$lengths}" reps="${reps_arg:-$reps}"
synth="${synth:-target/bench-cache/synth-9b${layers:+-l$layers}}"
out="${out:-target/kev9b-bars/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
log="$out/summary.txt"
say() { echo "$*" >> "$log"; echo "$*" >&2; }
note() { cat >> "$log"; }
machine() { # what shares the machine right now
    say "load: $(cut -d' ' -f1-3 /proc/loadavg); memory: $(free -g | awk '/^Mem:/ {print $7 " GiB available of " $2}')"
    say "busiest processes (CPU %, RSS MiB, command):"
    ps -eo pcpu,rss,comm --sort=-pcpu | awk 'NR>1 && NR<=6 {printf "  %s %d %s\n", $1, $2/1024, $3}' | note
}

flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2)
has() { [[ " $flags " == *" $1 "* ]]; }
say "# Kev-9B bars (issue 54)${layers:+, first $layers layers only}, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say "cpu: $(lscpu 2>/dev/null | grep -m1 -E '^Model name' | cut -d: -f2 | sed 's/^ *//') ($(nproc) cores)"
say "flags: $(for f in avx2 fma avx512f avx512bw avx512vl avx512_vnni avx_vnni avx512_bf16 amx_tile amx_int8 amx_bf16; do has "$f" && printf '%s ' "$f"; done)"
machine

# The best float arm: bf16 where the CPU has BF16 dot products (kev's default there), else fp32.
float=fp32
if has avx512_bf16 || has amx_bf16; then float=bf16; fi

cargo build --release --locked -p kev 2>&1 | tail -1 >&2
kev=target/release/kev
if [[ ! -f "$synth/base/config.json" || ! -f "$synth/kev/kev_head.json" ]]; then
    say "writing the 9B synthetic release${layers:+ (first $layers layers)} to $synth"
    "$kev" synth --config 9b ${layers:+--layers "$layers"} --shards 4 --out "$synth" > "$out/synth.log" 2>&1
fi
du -sh "$synth" | note

peers="${peers_arg:-llama,llama-q8,ik-llama-q}"
# A run's output into the summary without its logs: tracing lines, the GGUF writers' progress bars (redrawn with
# carriage returns: megabytes on one line) and llama.cpp's quantiser's metadata dump stay in the raw file only.
# A grep that keeps no line exits 1; under `set -e -o pipefail` that would end the whole run before its later legs.
report() {
    { grep -v -E 'INFO|WARN|^llama_|^version: |^built with ' "$1" | grep -v $'\r' || true; } | note
}
backbone() { # name, arms, then env assignments
    local name="$1" arms="$2"; shift 2
    say ""
    say "## backbone, kernels $name (started $(date -u '+%H:%M UTC'))"
    machine
    env "$@" KEV_LOG_FORMAT=text "$kev" bench backbone --base "$synth/base" --kev "$synth/kev" --arms "$arms" \
        --lengths "$lengths" --reps "$reps" --peers "$peers" --json "$out/backbone-$name.json" \
        > "$out/backbone-$name.txt" 2>&1
    report "$out/backbone-$name.txt"
}
decide() { # name, arms, then env assignments
    local name="$1" arms="$2"; shift 2
    say ""
    say "## decide 1q-json-190, kernels $name"
    env "$@" KEV_LOG_FORMAT=text "$kev" bench decide --base "$synth/base" --kev "$synth/kev" --arms "$arms" \
        --cases 1q-json-190 --reps "$decide_reps" --peers none --json "$out/decide-$name.json" \
        > "$out/decide-$name.txt" 2>&1
    report "$out/decide-$name.txt"
}

backbone native "$float,int8"
decide native "$float,int8"
if [[ $skip_avx2 -eq 0 ]] && has avx2 && has fma; then
    # AVX2 has no BF16 dot product: its float arm is fp32.
    backbone avx2 "fp32,int8" KEV_ISA=avx2
    decide avx2 "fp32,int8" KEV_ISA=avx2
fi
if [[ $skip_serve -eq 0 ]]; then
    for arm in int8 bf16 fp32; do
        say ""
        say "## kev serve --precision $arm: peak RSS"
        machine
        python3 tools/bench/serve_rss.py --kev "$kev" --arm "$arm" --out "$out/serve-$arm.json" \
            -- --base "$synth/base" --kev "$synth/kev" 2> "$out/serve-$arm.progress" || say "serve $arm failed"
    done
fi
say ""
say "## after"
machine
python3 tools/bench/kev9b_summary.py "$out" | tee -a "$log" >&2
say ""
say "(raw outputs and JSON reports in $out)"
