#!/usr/bin/env python3
"""PEFT's own LoRA merge on *unrounded* fp32 factors at real Kev-4B module shapes → a digest fixture.

    python tools/reference/merge_case.py --out fixtures/merge-4b.json

The synthetic release's LoRA sits on a grid where every summation order of `B @ A` agrees, so it cannot catch a merge
that sums in a different order than torch. Here W (BF16), A and B (fp32, full 24-bit mantissas) come from splitmix64
streams that the Rust test regenerates bit for bit (`crates/release/tests/merge_4b.rs`); only the sha256 of PEFT's
merged BF16 weight is stored. Value recipe, all in float32 (one rounding per operation, no fused multiply-add):
`u = (splitmix64(seed, i) >> 40) · 2^-24`, `v = (2u − 1) · s`; W = bf16(v) with s = 0.05, A with s = float32(1 / sqrt(in)),
B with s = 0.02; element i in row-major order; seeds 1 (W), 2 (A), 3 (B) plus 16 × the case index.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

CASES = [  # (module, out, in): real Kev-4B shapes
    ("self_attn.o_proj", 2560, 4096),
    ("linear_attn.in_proj_a", 32, 2560),
    ("mlp.down_proj", 2560, 9216),
]
R, ALPHA = 16, 32


def splitmix_uniform(seed: int, n: int, scale: float) -> np.ndarray:
    golden = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (np.arange(1, n + 1, dtype=np.uint64) * golden)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
    return (u * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)


def case(k: int, module: str, out_f: int, in_f: int) -> dict:
    from peft import LoraConfig, get_peft_model

    base = 16 * k
    w = torch.from_numpy(splitmix_uniform(base + 1, out_f * in_f, 0.05).reshape(out_f, in_f)).to(torch.bfloat16)
    a = torch.from_numpy(splitmix_uniform(base + 2, R * in_f, float(np.float32(1.0 / math.sqrt(in_f)))).reshape(R, in_f))
    b = torch.from_numpy(splitmix_uniform(base + 3, out_f * R, 0.02).reshape(out_f, R))
    leaf = module.rsplit(".", 1)[1]

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            setattr(self, leaf, torch.nn.Linear(in_f, out_f, bias=False))

    m = Holder()
    with torch.no_grad():
        getattr(m, leaf).weight.copy_(w.float())
    pm = get_peft_model(m, LoraConfig(r=R, lora_alpha=ALPHA, target_modules=[leaf], lora_dropout=0.0))
    with torch.no_grad():
        layer = getattr(pm.base_model.model, leaf)
        layer.lora_A["default"].weight.copy_(a)
        layer.lora_B["default"].weight.copy_(b)
    merged = getattr(pm.merge_and_unload(), leaf).weight.detach().to(torch.bfloat16)
    # An exact (float64) product, rounded once, disagrees somewhere: the case can tell summation orders apart.
    exact = (w.float() + ((b.double() @ a.double()) * (ALPHA / R)).float()).to(torch.bfloat16)
    differ = int((exact.view(torch.int16) != merged.view(torch.int16)).sum())
    digest = hashlib.sha256(merged.contiguous().view(torch.int16).numpy().tobytes()).hexdigest()
    return {"module": module, "out": out_f, "in": in_f, "seeds": [base + 1, base + 2, base + 3], "sha256": digest,
            "differs_from_exact_product": differ}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cases = [case(k, *c) for k, c in enumerate(CASES)]
    doc = {"r": R, "lora_alpha": ALPHA, "scale": ALPHA / R, "torch": torch.__version__, "cases": cases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
