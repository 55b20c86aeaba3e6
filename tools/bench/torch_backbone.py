#!/usr/bin/env python3
"""The torch peer of `kev bench backbone`: one row, no cache, through transformers' Qwen3.5 text backbone.

    python tools/bench/torch_backbone.py --model BASE_DIR --tokens 94,380,1518 --dtype float32|bfloat16 \
        --runs N [--warmup 1] [--threads 2] [--ids FILE.json] [--seed S] [--device cpu|cuda] --out FILE.json

The model is `AutoModelForCausalLM.from_pretrained(BASE_DIR, dtype=...).model` (what the author's reference uses),
called as `model(input_ids=row, use_cache=False)` under `torch.inference_mode()`; no LM head. Rows are the bench
stream's first N ids (`common.bench_ids`, the same splitmix64 stream `kev bench` draws) or the rows of `--ids`.
Each length: `--warmup` untimed runs, then `--runs` timed ones; the median is the figure. Output JSON:

    {"peer": "torch", "kind": "backbone", "dtype", "device", "threads", "model", "load_s", "rss_after_load_bytes",
     "peak_rss_bytes", "versions": {...}, "torch": {...},
     "results": [{"tokens", "runs", "warmup", "median_s", "min_s", "max_s", "samples_s", "hidden_rms"}]}

`hidden_rms` (root mean square of the last run's final-norm states) only shows the run computed something finite.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as B  # noqa: E402

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="base model directory (config.json + shards)")
    ap.add_argument("--tokens", default="94,380,1518", help="comma-separated row lengths")
    ap.add_argument("--ids", type=Path, help="JSON rows of token ids to time instead of the seeded stream")
    ap.add_argument("--seed", type=int, default=B.DEFAULT_SEED, help="bench stream seed")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: all cores)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.runs < 1 or args.warmup < 0:
        ap.error("--runs must be >= 1 and --warmup >= 0")
    warnings.filterwarnings("ignore")

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    dtype = getattr(torch, DTYPES[args.dtype])
    device = torch.device(args.device)

    if args.ids:
        rows = B.load_rows(args.ids)
    else:
        lengths = B.parse_lengths(args.tokens)
        stream = B.bench_ids(max(lengths), args.seed)
        rows = [stream[:n] for n in lengths]

    B.log(f"loading {args.model} as {DTYPES[args.dtype]} on {device} ({threads} threads)")
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=dtype).model.eval().to(device)
    load_s = time.perf_counter() - t
    rss_loaded = B.current_rss_bytes()
    vocab = model.get_input_embeddings().weight.shape[0]
    if max(max(r) for r in rows) >= vocab:
        raise SystemExit(f"token id out of range for a {vocab}-row embedding")
    B.log(f"loaded in {load_s:.1f}s, rss {rss_loaded / 2**30 if rss_loaded else float('nan'):.2f} GiB")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    results = []
    with torch.inference_mode():
        for row in rows:
            ids = torch.tensor([row], dtype=torch.long, device=device)
            for _ in range(args.warmup):
                model(input_ids=ids, use_cache=False)
            samples = []
            for r in range(args.runs):
                sync()
                t = time.perf_counter()
                out = model(input_ids=ids, use_cache=False).last_hidden_state
                sync()
                samples.append(time.perf_counter() - t)
                B.log(f"{len(row)} tokens run {r + 1}/{args.runs}: {samples[-1]:.3f}s")
            rms = float(out.float().pow(2).mean().sqrt())
            if not math.isfinite(rms):
                raise SystemExit(f"non-finite hidden states at {len(row)} tokens")
            results.append({"tokens": len(row), "runs": args.runs, "warmup": args.warmup, **B.summarize(samples),
                             "hidden_rms": rms})

    doc = {
        "peer": "torch",
        "kind": "backbone",
        "dtype": DTYPES[args.dtype],
        "device": str(device),
        "threads": threads,
        "model": str(args.model.resolve()),
        "ids": str(args.ids) if args.ids else {"stream": "splitmix64", "seed": args.seed, "vocab": B.ORDINARY_VOCAB},
        "load_s": load_s,
        "rss_after_load_bytes": rss_loaded,
        "peak_rss_bytes": B.peak_rss_bytes(),
        "versions": B.versions("torch", "transformers", "numpy"),
        "torch": B.torch_info(torch),
        "results": results,
    }
    if device.type == "cuda":
        doc["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    B.write_json(args.out, doc)
    B.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
