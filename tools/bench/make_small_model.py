#!/usr/bin/env python3
"""Write a small random-weight Kev release (base + kev dirs) in the published layout, to exercise the peer scripts
end to end where `kev synth`'s 4B-shaped release (≈ 8.4 GB) is not at hand or too slow for a smoke run.

    python tools/bench/make_small_model.py --out DIR [--hidden 1024] [--layers 8] [--seed 7]

Writes `DIR/base/` (composite `qwen3_5` config.json, two safetensors shards with `model.language_model.*` /
`model.visual.*` names + index, the fixtures' base-variant tokenizer files) and `DIR/kev/` (a PEFT LoRA r=16 over
the 12 target modules, a `head.pt` of the author's key set, the Kev-variant tokenizer files). Widths scale the real
4B's proportions (hidden 2560, MLP 3.6×, 16/4 attention heads × 256, linear key/value heads 16/32 × 128) down to
`--hidden`; the vocabulary (248,320 rows) and the 3 GDN : 1 attention layer pattern are real. Weights are
transformers' own random init (seeded), stored BF16 except `A_log` and the gated norm (F32), as published.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tools" / "reference"))


def text_config(hidden: int, layers: int) -> dict:
    if hidden % 128:
        raise SystemExit("--hidden must be a multiple of 128")
    if layers % 4:
        raise SystemExit("--layers must be a multiple of 4 (3 GDN : 1 attention)")
    heads = max(2, hidden // 160)  # 2560 → 16
    kv = max(1, heads // 4)
    lin_k = max(1, hidden // 160)  # 2560 → 16 key heads × 128
    return {
        "attention_bias": False,
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": (hidden * 18 // 5) // 128 * 128,  # 2560 → 9216
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": lin_k,
        "linear_num_value_heads": 2 * lin_k,
        "linear_value_head_dim": 128,
        "max_position_embeddings": 262144,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "tie_word_embeddings": True,
        "vocab_size": 248320,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--fixtures", type=Path, default=REPO / "fixtures" / "release",
                    help="where the tokenizer files are taken from")
    args = ap.parse_args()

    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    tc = text_config(args.hidden, args.layers)
    cfg = Qwen3_5Config(
        text_config=tc,
        vision_config={"depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
                       "out_hidden_size": args.hidden, "patch_size": 2, "spatial_merge_size": 2,
                       "temporal_patch_size": 2, "num_position_embeddings": 16, "deepstack_visual_indexes": []},
        tie_word_embeddings=True,
    )
    model = Qwen3_5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # HF initialises (1+w) norms to 0 and A_log to a fixed pattern; random values make the model less
            # degenerate (the timing does not depend on values, but a sane hidden state is a cheap sanity check).
            if name.endswith("norm.weight") and "linear_attn" not in name:
                p.uniform_(-0.3, 0.3)
    base = args.out / "base"
    kev = args.out / "kev"
    for d in (base, kev):
        if d.exists():
            shutil.rmtree(d)
    model = model.to(torch.bfloat16)
    for name, mod in model.named_modules():
        if name.endswith("linear_attn"):
            mod.A_log.data = mod.A_log.data.float()
            mod.norm.weight.data = mod.norm.weight.data.float()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(str(base), max_shard_size=max(total // 2 + 1, 1 << 20))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(args.fixtures / "base" / f, base / f)
    del model

    from kevref import release as R

    R.write_adapter(base, kev, args.seed)
    d = args.hidden
    head = R.PointerHead(d, 256)
    with torch.no_grad():
        for n, p in head.named_parameters():
            p.normal_(0.0, 2.2 / d**0.5 if n.endswith("weight") else 0.3)
    payload = {
        "base": R.BASE_REPO, "base_revision": R.BASE_REVISION, "lora": R.LORA_R, "head_dim": 256,
        "option_isolation": False, "special_embeddings": False, "weights_dtype": "bfloat16",
        "temperature": 2.41, "lora_placement": "all", "head": head.state_dict(),
    }
    torch.save(payload, str(kev / "head.pt"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(args.fixtures / "kev" / f, kev / f)
    shards = sorted(p.name for p in base.glob("*.safetensors"))
    print(json.dumps({"base": str(base), "kev": str(kev), "shards": shards, "bytes": total}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
