#!/usr/bin/env bash
# A/B of two kev binaries on the backbone, pair by pair: for each round and arm, `kev bench backbone` of A then B
# (the order alternating by round, so a drift of the machine's speed falls on both), and per (arm, length) the
# median over rounds of each pair's ratio B/A. What a change that must not cost speed is held to ("every arm at
# 94 and 1,518 tokens within noise": the median ratio ≤ 1.02).
#
#   tools/bench/ab_backbone.sh OLD_KEV NEW_KEV RELEASE_DIR [ROUNDS] [ARMS] [LENGTHS]
#
# RELEASE_DIR holds base/ and kev/ (`kev synth --out RELEASE_DIR`). ARMS default `fp32,bf16,int8`, LENGTHS
# `94,1518`, ROUNDS 3; REPS (timed runs per row in one process, default 2) and WARMUP (default 1) from the
# environment. KEV_ISA is passed through (run once natively and once with KEV_ISA=avx2). Writes every
# report under target/ab-backbone/<time>/ and prints the summary; each run is one process (its load included
# in the wall time, not in the figures: the bench times the forward alone).
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,12p "$0"; exit 2; }
old=$1 new=$2 rel=$3 rounds=${4:-3} arms=${5:-fp32,bf16,int8} lengths=${6:-94,1518}
out="target/ab-backbone/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
echo "A = $old, B = $new, $rel, $rounds rounds, arms $arms, lengths $lengths, reps ${REPS:-2}, KEV_ISA=${KEV_ISA:-unset} -> $out"
grep -m1 'model name' /proc/cpuinfo || true
run() { # bin label arm round
    "$1" bench backbone --base "$rel/base" --kev "$rel/kev" --arms "$3" --lengths "$lengths" \
        --reps "${REPS:-2}" --warmup "${WARMUP:-1}" --peak-seconds 0.2 --peers none --json "$out/$2-$3-$4.json" >/dev/null 2>"$out/$2-$3-$4.log"
}
for r in $(seq 1 "$rounds"); do
    for arm in ${arms//,/ }; do
        if (( r % 2 )); then run "$old" A "$arm" "$r"; run "$new" B "$arm" "$r"
        else run "$new" B "$arm" "$r"; run "$old" A "$arm" "$r"; fi
        echo "round $r $arm done"
    done
done
python3 - "$out" "$rounds" "$arms" <<'EOF'
import json, os, statistics, sys
out, rounds, arms = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
def rows(label, arm, r):
    d = json.load(open(os.path.join(out, f"{label}-{arm}-{r}.json")))
    return {row["tokens"]: row["median_s"] for row in d["rows"] if row["arm"] == arm}
summary = {}
print(f"{'arm':>5} {'tokens':>6} | {'A median s':>10} {'B median s':>10} | B/A per pair (median)")
for arm in arms:
    pairs = [(rows("A", arm, r), rows("B", arm, r)) for r in range(1, rounds + 1)]
    for n in sorted(pairs[0][0]):
        ratios = [b[n] / a[n] for a, b in pairs]
        med = statistics.median(ratios)
        summary[f"{arm}@{n}"] = {"ratios": ratios, "median_ratio": med,
                                 "a_s": [a[n] for a, _ in pairs], "b_s": [b[n] for _, b in pairs]}
        print(f"{arm:>5} {n:>6} | {statistics.median(summary[f'{arm}@{n}']['a_s']):>10.3f} "
              f"{statistics.median(summary[f'{arm}@{n}']['b_s']):>10.3f} | "
              + " ".join(f"{x:.3f}" for x in ratios) + f"  ({med:.3f})")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
worst = max(v["median_ratio"] for v in summary.values())
print(f"worst median B/A {worst:.3f}: {'within' if worst <= 1.02 else 'OVER'} the 2 % bar")
EOF
