#!/usr/bin/env bash
# Decisions on a 0.8B-shaped synthetic release against the Python reference generator, fp32, exact weights.
#
#   bash tools/bench/parity_0_8b.sh PYTHON [DIR] [REQUESTS_DIR]
#
# PYTHON: an interpreter with tools/reference/requirements.txt (torch, transformers, peft, safetensors).
# DIR (default target/synth-0.8b): where `kev synth --config 0.8b` writes the release (≈ 1.5 GB; kept for reuse).
# REQUESTS_DIR (default: a subset of fixtures/accept/requests written under DIR): the request bodies.
#
# Steps: `kev synth --config 0.8b` (random weights in the real Qwen3.5-0.8B shape, the Kev tokenizer, a random
# head naming Qwen3.5-0.8B-Base), tools/bench/head_pt.py (head.pt from the same tensors), pins of the directory
# under the Kev-0.8B repository names (the synthetic head names the real base), then
# `kev accept --arms exact-fp32 --reference PYTHON`: the reference runs the author's row form with transformers +
# PEFT in float32 on the same files (LoRA unmerged); the gates hold kev's exact-fp32 arm within 1e-4 (max |Δp|)
# of it, besides the published bar. Report: DIR/accept.{json,md}. Needs the release binary (cargo build --release -p kev).
set -euo pipefail

PY=${1:?usage: parity_0_8b.sh PYTHON [DIR] [REQUESTS_DIR]}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${2:-$ROOT/target/synth-0.8b}
KEV=${KEV_BIN:-$ROOT/target/release/kev}
[[ -x "$KEV" ]] || { echo "no $KEV: cargo build --release -p kev" >&2; exit 2; }

if [[ ! -f "$DIR/base/config.json" ]]; then
    "$KEV" synth --config 0.8b --out "$DIR" --shards 1 --seed 8 >"$DIR.synth.json"
fi
[[ -f "$DIR/kev/head.pt" ]] || "$PY" "$ROOT/tools/bench/head_pt.py" --kev "$DIR/kev" >&2

REQ=${3:-}
if [[ -z "$REQ" ]]; then
    # Every question type, 1 to 48 options, literal delimiters, non-Latin scripts, multi-question requests:
    # 14 of the 34 requests of `kev accept`'s set (the whole set is 26,260 row tokens, too long for torch fp32
    # on a shared 2-core machine).
    REQ="$DIR/requests"
    mkdir -p "$REQ"
    for r in choice-basic choice-1 choice-48 choice-5-mixed-descriptions choice-nonascii-names devanagari \
        accents-nfc eight-questions literal-delimiters multi-3 noul-both-criteria score-5 score-mixed-levels \
        ticket-noul; do
        cp "$ROOT/fixtures/accept/requests/$r.json" "$REQ/"
    done
fi

"$PY" - "$DIR" <<'PY'
import hashlib, json, os, sys
root = sys.argv[1]
def repo(name, rev, d):
    files = []
    for dp, _, fs in os.walk(d):
        for f in sorted(fs):
            p = os.path.join(dp, f)
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()
            files.append({"name": os.path.relpath(p, d), "size": os.path.getsize(p), "kind": "sha256", "digest": h})
    return {"repo": name, "revision": rev, "files": sorted(files, key=lambda x: x["name"])}
pins = {"name": "synthetic Kev-0.8B shape",
        "kev": repo("jaredpalmer/kev-0.8b", "bf75a6a8848ea6960ff2ed108d9ed44c2941174f", os.path.join(root, "kev")),
        "base": repo("Qwen/Qwen3.5-0.8B-Base", "dc7cdfe2ee4154fa7e30f5b51ca41bfa40174e68", os.path.join(root, "base"))}
json.dump(pins, open(os.path.join(root, "pins.json"), "w"), indent=1)
PY

"$KEV" accept --base "$DIR/base" --kev "$DIR/kev" --pins "$DIR/pins.json" --arms exact-fp32 \
    --reference "$PY" --requests "$REQ" --out "$DIR/accept"
