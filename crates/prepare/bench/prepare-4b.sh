#!/usr/bin/env bash
# Benchmark `kev prepare` on a 4B-shaped synthetic release (real Qwen3.5-4B shapes, random values).
#
#   bash crates/prepare/bench/prepare-4b.sh [WORKDIR]      (default WORKDIR: /tmp/kev-prepare-bench)
#
# Needs ~18 GB of disk in WORKDIR, a release build of `kev` (built here if missing), and a Python with
# torch for head.pt (`torch.save` is the format under test; $PYTHON, default ../.venv-ref/bin/python).
# Prints wall time and peak RSS of `kev prepare` (from /usr/bin/time) and of the verify pass.
set -euo pipefail
cd "$(dirname "$0")/../../.."
work=${1:-/tmp/kev-prepare-bench}
py=${PYTHON:-../.venv-ref/bin/python}
target=${CARGO_TARGET_DIR:-target}
kev="$target/release/kev"
[ -x "$kev" ] || cargo build --release -p kev
mkdir -p "$work"
if [ ! -f "$work/release/base/model.safetensors.index.json" ]; then
  rm -rf "$work/release"
  "$kev" synth --out "$work/release" --config 4b --shards 2 >/dev/null
fi
# The Kev side `kev synth` does not write: head.pt (torch.save, hidden 2560 → 256) and tokenizer.json.
"$py" - "$work/release/kev/head.pt" <<'PY'
import sys, collections, torch
g = torch.Generator().manual_seed(0)
head = collections.OrderedDict()
for p in ("q", "k"):
    head[f"{p}.weight"] = torch.randn(256, 2560, generator=g) * 0.02
    head[f"{p}.bias"] = torch.randn(256, generator=g) * 0.02
torch.save({"base": "Qwen/Qwen3.5-4B-Base", "base_revision": "1001bb4d826a52d1f399e183466143f4da7b741b",
            "lora": 16, "head_dim": 256, "option_isolation": False, "special_embeddings": False,
            "weights_dtype": "bfloat16", "temperature": 2.406050072164233, "lora_placement": "all",
            "head": head}, sys.argv[1])
PY
cp fixtures/release/kev/tokenizer.json "$work/release/kev/tokenizer.json"
rm -rf "$work/prepared"
sync
echo "== kev prepare (4B-shaped, local directories)"
/usr/bin/time -f "wall %e s, peak RSS %M KiB, user %U s, sys %S s" \
  "$kev" prepare --quiet --kev-dir "$work/release/kev" --base-dir "$work/release/base" --out "$work/prepared"
echo "== kev verify"
/usr/bin/time -f "wall %e s, peak RSS %M KiB" "$kev" verify "$work/prepared" | tail -1
