#!/usr/bin/env python3
"""The author's arithmetic on the 9B-shaped test release (`fixtures/shape-9b/expected.json`).

The release is written by the Rust test that checks it (`crates/decide/tests/integration/shape_9b.rs`: every 9B
width, one DeltaNet and one attention layer, a 1,024-row vocabulary, untied with an `lm_head.weight`, a random
rank-16 LoRA and pointer head), so both sides read the same bytes; this script computes the three arms on it:

    KEV_SHAPE_9B_OUT=/tmp/shape-9b cargo test -p kev-decide --test integration -- --ignored \\
        write_the_9b_shaped_release_for_the_reference
    .venv-ref/bin/python tools/reference/shape_9b.py --release /tmp/shape-9b --out fixtures/shape-9b/expected.json

Arms (`kevref/arms.py`): `reference` = transformers' `AutoModelForCausalLM.from_pretrained(base, float32).model`
with the LoRA unmerged through PEFT; `merged_bf16` = PEFT's merge with the adapted weights rounded to bf16,
computed in fp32; `torch_bf16` = the merged model in torch bfloat16. Each row runs from position 0 without cache;
the pointer head reads its option ends and its decide position: `z = (k·q)·head_dim^-0.5 / T`, softmax, fp32.
Needs ≈ 4 GB of memory and a minute on one thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from kevref import arms as A  # noqa: E402


def head_of(kev: Path) -> A.Head:
    """The prepared head (`head.safetensors` + `kev_head.json`) as the reference's `Head`."""
    from safetensors.torch import load_file

    t = load_file(str(kev / "head.safetensors"))
    meta = json.loads((kev / "kev_head.json").read_text())
    return A.Head(t["q.weight"], t["q.bias"], t["k.weight"], t["k.bias"], float(meta["temperature"]),
                  int(meta["head_dim"]), meta["meta"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", type=Path, required=True, help="the directory the Rust writer filled")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    t0 = time.time()
    base, kev = args.release / "base", args.release / "kev"
    rows = json.loads((args.release / "rows.json").read_text())
    head = head_of(kev)
    out = {"arms": {}}
    for arm in A.ARMS:
        model = A.load_arm(arm, base, kev)
        probs = []
        for r in rows:
            h = A.row_hidden(model, r["ids"])
            *ends, decide = r["readout"]
            probs.append(head.probs(h, ends, decide))
        out["arms"][arm] = probs
        print(f"[{time.time() - t0:6.1f}s] {arm}: {len(rows)} rows", file=sys.stderr, flush=True)
        del model
    worst = max(abs(a - b) for ra, rb in zip(out["arms"]["reference"], out["arms"]["torch_bf16"]) for a, b in zip(ra, rb))
    doc = {
        "what": "tools/reference/shape_9b.py on the release crates/decide/tests/integration/shape_9b.rs writes",
        "torch": torch.__version__,
        "files": json.loads((args.release / "files.json").read_text()),
        "rows": rows,
        "arms": out["arms"],
        "torch_bf16_vs_reference_max_abs_dp": worst,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}; torch bf16 vs reference max |dp| {worst:.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
