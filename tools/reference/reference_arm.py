#!/usr/bin/env python3
"""Run the author's fp32 reference arm (and optionally the merged-bf16 and torch-bf16 arms) on request bodies.

    python tools/reference/reference_arm.py --base DIR --kev DIR --requests DIR_OR_FILE [...] --out FILE.json \
        [--arms reference,merged_bf16,torch_bf16] [--hidden]

DIR_OR_FILE: request bodies (`*.json`, raw bytes as sent); a directory means every `*.json` in it, sorted.
`--kev DIR` must hold `adapter_config.json`, `adapter_model.safetensors`, `head.pt` and the Kev-variant
`tokenizer.json` (kev-contract §4.2a). Output: `{"base", "kev", "arms", "requests": [...]}` where each entry is
`{"name", "path"}` plus either the `expected/valid/*.json` record (fixtures/README.md; arms not run are null) or
`{"status", "body"}` for a request Kev rejects. With `--hidden`, the reference readout states go to
`FILE.hidden/<name>.safetensors`. Arms run one at a time (the real 4B in fp32 needs ~17 GB of memory).
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
from kevref import expected as E  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="base model directory (Qwen3.5 checkpoint)")
    ap.add_argument("--kev", type=Path, required=True, help="Kev directory (adapter, head.pt, tokenizer.json)")
    ap.add_argument("--requests", type=Path, nargs="+", required=True, help="request files or directories")
    ap.add_argument("--out", type=Path, required=True, help="output JSON file")
    ap.add_argument("--arms", default="reference", help="comma-separated subset of " + ",".join(A.ARMS))
    ap.add_argument("--hidden", action="store_true", help="also write reference readout hidden states")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    unknown = [a for a in arms if a not in A.ARMS]
    if unknown or not arms:
        ap.error(f"unknown arms {unknown}; choose from {','.join(A.ARMS)}")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    files: list[Path] = []
    for p in args.requests:
        files.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    if not files:
        ap.error("no request files")
    names = [f.stem for f in files]
    if len(set(names)) != len(names):
        ap.error("request file names must be unique (they name the outputs)")
    bodies = [(f.stem, f.read_bytes()) for f in files]
    path_of = {f.stem: str(f) for f in files}

    t0 = time.time()
    ok, bad = E.classify(bodies, args.kev / "tokenizer.json")
    hidden_dir = args.out.with_name(args.out.name + ".hidden")
    records, hidden = E.valid_records(
        args.base, args.kev, ok, arms=arms,
        hidden_names={n for n, _, _ in ok} if args.hidden else frozenset(),
        request_path=lambda n: path_of[n], hidden_path=lambda n: str(hidden_dir / f"{n}.safetensors"),
        log=lambda m: print(f"[{time.time() - t0:7.1f}s] {m}", file=sys.stderr, flush=True),
    )
    by_name = {n: {"name": n, "path": path_of[n], **rec} for (n, _, _), rec in zip(ok, records)}
    for n, status, body in bad:
        by_name[n] = {"name": n, "path": path_of[n], "status": status, "body": body}
    doc = {"base": str(args.base), "kev": str(args.kev), "arms": list(arms), "requests": [by_name[n] for n in names]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, ensure_ascii=False) + "\n", encoding="utf-8")
    if hidden:
        from safetensors.torch import save_file

        hidden_dir.mkdir(parents=True, exist_ok=True)
        for n, tensors in hidden.items():
            save_file(tensors, str(hidden_dir / f"{n}.safetensors"))
    print(f"{len(ok)} answered, {len(bad)} rejected, {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
