#!/usr/bin/env python3
"""Write `head.pt` (the author's `torch.save` format) from a prepared head (`head.safetensors` + `kev_head.json`).

    python tools/bench/head_pt.py --kev DIR [--out DIR/head.pt]

`kev synth` writes its random pointer head in the prepared form only (a `head.pt` is a torch pickle). Where a
consumer wants `head.pt` — `kev decide --base/--kev`, `kev prepare`, or the torch peers — this writes one from the
same fp32 tensors, with the metadata of `kev_head.json` in the real key order, so both engines use one head. The
file is read back and compared tensor for tensor before the script reports success.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common as B  # noqa: E402

KEYS = ["q.weight", "q.bias", "k.weight", "k.bias"]


def load_prepared(kev: Path):
    """The head tensors (fp32, key order of a `state_dict()`) and the `kev_head.json` document."""
    from safetensors.torch import load_file

    doc = json.loads((kev / "kev_head.json").read_text())
    tensors = load_file(str(kev / doc.get("weights", "head.safetensors")))
    missing = [k for k in KEYS if k not in tensors]
    if missing:
        raise SystemExit(f"{kev}: head.safetensors lacks {missing}")
    return OrderedDict((k, tensors[k].float().contiguous()) for k in KEYS), doc


def payload(head: OrderedDict, doc: dict) -> dict:
    meta = doc["meta"]
    return {
        "base": meta["base"],
        "base_revision": meta["base_revision"],
        "lora": meta["lora"],
        "head_dim": int(meta["head_dim"]),
        "option_isolation": meta["option_isolation"],
        "special_embeddings": meta["special_embeddings"],
        "weights_dtype": meta["weights_dtype"],
        "temperature": float(meta["temperature"]),
        "lora_placement": meta["lora_placement"],
        "head": head,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kev", type=Path, required=True, help="directory with head.safetensors + kev_head.json")
    ap.add_argument("--out", type=Path, help="where to write (default: KEV/head.pt)")
    args = ap.parse_args()
    import torch

    head, doc = load_prepared(args.kev)
    out = args.out or args.kev / "head.pt"
    torch.save(payload(head, doc), str(out))
    back = torch.load(str(out), map_location="cpu", weights_only=True)
    for k in KEYS:
        if not torch.equal(back["head"][k], head[k]):
            raise SystemExit(f"{out}: {k} did not read back equal")
    B.log(f"wrote {out} (head_dim {back['head_dim']}, temperature {back['temperature']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
