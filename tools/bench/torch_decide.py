#!/usr/bin/env python3
"""The torch peer of `kev bench decide`: the author's row form, every question as its own row from position 0.

    python tools/bench/torch_decide.py --base DIR --kev DIR --requests FILE.jsonl --dtype float32 --runs N \
        [--warmup 1] [--threads 2] --out FILE.json

Requests: one SystemOne request body per line (blank lines skipped). The model comes from the reference generator's
own code (`tools/reference/kevref`): `--dtype float32` is the author's fp32 arm (`reference`: transformers
float32 backbone, PEFT LoRA unmerged, pointer head in fp32), `--dtype bfloat16` is the `torch_bf16` arm (LoRA merged
by PEFT, backbone cast to bfloat16, head in fp32). A request's time is its whole path in the author's form:
render + tokenize (`kevref.contract.compile_request`), then per question one row with no cache and the pointer
head. `--warmup` untimed passes over all requests, then `--runs` timed passes; per request the median is the
figure. Output JSON:

    {"peer": "torch", "kind": "decide", "arm", "dtype", "threads", "base", "kev", "tokenizer", "head", "load_s",
     "peak_rss_bytes", "versions", "torch", "requests": [{"index", "questions", "row_tokens": [...], "input_tokens",
     "median_s", "min_s", "max_s", "samples_s", "tokenize_median_s", "probabilities": [[...] per question]}]}

`probabilities` (last timed run) let the caller check both engines answered the same questions. The head comes
from `head.pt`, else from the prepared form `kev synth` writes into `kev/` (`head.safetensors` + `kev_head.json`,
the very tensors `kev bench decide` loads), else (an adapter-only release) from a seeded random head of the real
shape; a release without `tokenizer.json` is tokenized with the repository's Kev tokenizer (`--tokenizer-from`).
`"tokenizer"` and `"head"` in the answer say which (with a random head the probabilities mean nothing; the time is
the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "reference"))
import common as B  # noqa: E402

ARMS = {"float32": "reference", "fp32": "reference", "bfloat16": "torch_bf16", "bf16": "torch_bf16"}


def random_head(base: Path):
    """A seeded pointer head of the real shape (hidden → 256) for a release without `head.pt` (a bare synthetic
    one): the head is two small matrix-vector products, so timing does not depend on its values."""
    import torch
    from kevref import arms as A

    cfg = json.loads((base / "config.json").read_text())
    d = cfg.get("text_config", cfg)["hidden_size"]
    g = torch.Generator().manual_seed(0)
    w = lambda *shape: torch.randn(*shape, generator=g) * d**-0.5  # noqa: E731
    return A.Head(w(256, d), w(256), w(256, d), w(256), 1.0, 256, {})


def prepared_head(kev: Path):
    """The head `kev synth` writes (`head.safetensors` + `kev_head.json`), as the reference's `Head`."""
    import head_pt
    from kevref import arms as A

    head, doc = head_pt.load_prepared(kev)
    meta = head_pt.payload(head, doc)
    return A.Head(head["q.weight"], head["q.bias"], head["k.weight"], head["k.bias"], float(meta["temperature"]),
                  int(meta["head_dim"]), {k: v for k, v in meta.items() if k != "head"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="base model directory")
    ap.add_argument("--kev", type=Path, required=True, help="Kev directory (adapter, head.pt, tokenizer.json)")
    ap.add_argument("--requests", type=Path, required=True, help="JSONL: one request body per line")
    ap.add_argument("--dtype", default="float32", choices=sorted(ARMS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: all cores)")
    ap.add_argument("--tokenizer-from", type=Path, default=HERE.parent.parent / "fixtures" / "release" / "kev" /
                    "tokenizer.json", help="Kev tokenizer for a release dir without one (default: the repository's)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.runs < 1 or args.warmup < 0:
        ap.error("--runs must be >= 1 and --warmup >= 0")
    warnings.filterwarnings("ignore")

    bodies = []
    for n, line in enumerate(args.requests.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                bodies.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{args.requests}:{n}: not JSON: {e}") from None
    if not bodies:
        raise SystemExit(f"{args.requests}: no requests")

    import torch
    from kevref import arms as A
    from kevref import contract as C

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    arm = ARMS[args.dtype]
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        if not (args.kev / f).is_file():
            raise SystemExit(f"{args.kev} has no {f}: not a Kev release directory")
    tokenizer = args.kev / "tokenizer.json"
    if not tokenizer.is_file():
        tokenizer = args.tokenizer_from
        B.log(f"{args.kev} has no tokenizer.json: using {tokenizer}")
    tok = C.KevTokenizer(tokenizer)
    if (args.kev / "head.pt").is_file():
        head, head_from = A.Head.load(args.kev / "head.pt"), str(args.kev / "head.pt")
    elif (args.kev / "kev_head.json").is_file():
        head, head_from = prepared_head(args.kev), str(args.kev / "head.safetensors")
    else:
        head, head_from = random_head(args.base), "random (no head.pt)"
        B.log(f"{args.kev} has no head.pt: timing with a random pointer head (its cost is the same)")
    for i, body in enumerate(bodies):
        C.compile_request(body, tok)  # fail early on a request the reference would reject
    B.log(f"loading the {arm} arm from {args.base} + {args.kev} ({threads} threads)")
    t = time.perf_counter()
    model = A.load_arm(arm, args.base, args.kev)
    load_s = time.perf_counter() - t
    B.log(f"loaded in {load_s:.1f}s")

    def answer(body: dict) -> tuple[float, list[list[float]], C.Compiled]:
        t0 = time.perf_counter()
        c = C.compile_request(body, tok)
        t_tok = time.perf_counter() - t0
        probs = [head.probs(A.row_hidden(model, q.row_ids), q.option_ends, q.decide) for q in c.questions]
        return t_tok, probs, c

    for w in range(args.warmup):
        for body in bodies:
            answer(body)
        B.log(f"warm-up pass {w + 1}/{args.warmup} done")
    samples = [[] for _ in bodies]
    tok_samples = [[] for _ in bodies]
    last = [None] * len(bodies)
    for r in range(args.runs):
        for i, body in enumerate(bodies):
            t0 = time.perf_counter()
            t_tok, probs, c = answer(body)
            samples[i].append(time.perf_counter() - t0)
            tok_samples[i].append(t_tok)
            last[i] = (probs, c)
        B.log(f"run {r + 1}/{args.runs}: " + ", ".join(f"{s[-1]:.3f}s" for s in samples))

    reqs = []
    for i, (probs, c) in enumerate(last):
        reqs.append({
            "index": i,
            "questions": len(c.questions),
            "row_tokens": [len(q.row_ids) for q in c.questions],
            "input_tokens": c.input_tokens,
            **B.summarize(samples[i]),
            "tokenize_median_s": statistics.median(tok_samples[i]),
            "probabilities": probs,
        })
    doc = {
        "peer": "torch",
        "kind": "decide",
        "arm": arm,
        "dtype": "float32" if arm == "reference" else "bfloat16",
        "threads": threads,
        "base": str(args.base.resolve()),
        "kev": str(args.kev.resolve()),
        "tokenizer": str(tokenizer),
        "head": head_from,
        "load_s": load_s,
        "peak_rss_bytes": B.peak_rss_bytes(),
        "versions": B.versions("torch", "transformers", "peft", "numpy"),
        "torch": B.torch_info(torch),
        "requests": reqs,
    }
    B.write_json(args.out, doc)
    B.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
