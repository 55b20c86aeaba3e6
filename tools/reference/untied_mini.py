#!/usr/bin/env python3
"""The untied miniature: kev-mini as an **untied** checkpoint, the way Qwen3.5-9B-Base is published, with the
author's arithmetic's answers on it.

    .venv-ref/bin/python tools/reference/untied_mini.py --out fixtures/mini-untied     # ≈ 1 min, one torch thread

Writes (layout in fixtures/README.md):

* `base/`: kev-mini's `config.json` with `tie_word_embeddings: false` (top level and `text_config`), kev-mini's two
  shards (relative symlinks: the same trained weights), a third shard `lm_head.safetensors` holding only
  `lm_head.weight [248320, 64]`, and the index over all three. Every value of the LM head is NaN (bf16 0x7FC0): a
  decision never reads the LM head, so any arm that did would answer NaN, and the shard compresses to nothing.
* `kev/`: kev-mini's adapter (symlinks) and a `head.pt` in the key set a public port records for Kev-9B's
  (`head`, `temperature`, `head_dim`, `base`, `base_revision`, `weights_dtype`, `lora`, `weights`,
  `option_isolation`: no `special_embeddings`, no `lora_placement`), with kev-mini's head tensors and temperature.
* `expected.jsonl`: the first `--requests` requests of kev-mini's test split (`fixtures/mini/expected/test.jsonl`),
  each with the reference, merged-bf16 and torch-bf16 arms' probabilities computed here, on this release, through
  transformers' untied model + PEFT (`kevref/arms.py`), in the `expected/test.jsonl` record shape.
* `summary.json`: counts, and the largest |Δp| between this release's reference arm and kev-mini's recorded one on
  the same requests (the LM head is not part of the backbone, so tying must not move an answer: asserted < 1e-6).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from kevref import arms as A  # noqa: E402
from kevref import expected as E  # noqa: E402
from kevref import release as R  # noqa: E402

LM_HEAD_FILE = "lm_head.safetensors"


def link(path: Path, target: Path) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    os.symlink(os.path.relpath(target, path.parent), path)


def write_base(mini: Path, out: Path) -> dict:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((mini / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    cfg["text_config"]["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    index = json.loads((mini / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        link(out / shard, mini / shard)
    for tok in ("tokenizer.json", "tokenizer_config.json"):
        link(out / tok, (mini / tok).resolve())
    tc = cfg["text_config"]
    lm_head = torch.full((tc["vocab_size"], tc["hidden_size"]), float("nan"), dtype=torch.bfloat16)
    save_file({"lm_head.weight": lm_head}, str(out / LM_HEAD_FILE), metadata={"format": "pt"})
    os.chmod(out / LM_HEAD_FILE, 0o644)
    index["weight_map"]["lm_head.weight"] = LM_HEAD_FILE
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    index["metadata"]["total_size"] += lm_head.numel() * lm_head.element_size()
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return cfg


def write_kev(mini_kev: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        link(out / name, mini_kev / name)
    for tok in ("tokenizer.json", "tokenizer_config.json"):
        link(out / tok, (mini_kev / tok).resolve())
    src = torch.load(str(mini_kev / "head.pt"), map_location="cpu", weights_only=True)
    # The key order of the record the port's work log gives for Kev-9B's head.pt.
    payload = OrderedDict(
        head=src["head"],
        temperature=src["temperature"],
        head_dim=src["head_dim"],
        base=src["base"],
        base_revision=src["base_revision"],
        weights_dtype="fp32",
        lora=src["lora"],
        weights="lora",
        option_isolation=False,
    )
    R.deterministic_torch_save(dict(payload), out / "head.pt")
    return {k: v for k, v in payload.items() if k != "head"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mini", type=Path, default=HERE.parents[1] / "fixtures" / "mini")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=48)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    t0 = time.time()
    log = lambda m: print(f"[{time.time() - t0:6.1f}s] {m}", file=sys.stderr, flush=True)  # noqa: E731

    base, kev = args.out / "base", args.out / "kev"
    write_base(args.mini / "base", base)
    meta = write_kev(args.mini / "kev", kev)
    log(f"wrote {base} and {kev} (head keys {list(meta)})")

    lines = (args.mini / "expected" / "test.jsonl").read_text().splitlines()[: args.requests]
    recorded = [json.loads(line) for line in lines]
    bodies = [(r["id"], r["body"].encode()) for r in recorded]
    ok, bad = E.classify(bodies, kev / "tokenizer.json")
    if bad:
        raise AssertionError(f"kev-mini test requests refused: {[n for n, _, _ in bad]}")
    records, _ = E.valid_records(base, kev, ok, arms=A.ARMS, log=log)

    worst = 0.0
    out_lines = []
    for (name, _req, _c), rec, old in zip(ok, records, recorded):
        for q, oq in zip(rec["questions"], old["questions"]):
            if q["row_ids"] != oq["row_ids"]:
                raise AssertionError(f"{name}: rows differ from kev-mini's")
            for a, b in zip(q["reference"], oq["reference"]):
                worst = max(worst, abs(a - b))
            if any(x != x for arm in A.ARMS for x in q[arm]):
                raise AssertionError(f"{name}: NaN in an arm: the LM head was read")
        line = {"id": name, "body": old["body"], "input_tokens": rec["input_tokens"], "questions": rec["questions"],
                "response": rec["response"], "response_merged_bf16": rec["response_merged_bf16"]}
        out_lines.append(json.dumps(line, ensure_ascii=False))
    if worst >= 1e-6:
        raise AssertionError(f"untying moved the reference arm by {worst}")
    (args.out / "expected.jsonl").write_text("\n".join(out_lines) + "\n", encoding="utf-8")
    summary = {
        "requests": len(records),
        "questions": sum(len(r["questions"]) for r in records),
        "reference_vs_kev_mini_max_abs_dp": worst,
        "head_keys": list(meta),
        "lm_head": {"shape": [248320, 64], "dtype": "BF16", "values": "NaN (0x7FC0)", "file": LM_HEAD_FILE},
        "torch": torch.__version__,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"{summary['requests']} requests, {summary['questions']} questions; vs kev-mini max |dp| {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
