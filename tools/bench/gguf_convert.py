#!/usr/bin/env python3
"""Run llama.cpp's `convert_hf_to_gguf.py` unchanged, with one fallback for synthetic tokenizers.

    python tools/bench/gguf_convert.py --llama-src DIR --report FILE.json -- [convert_hf_to_gguf.py arguments]

The converter names the BPE pre-tokenizer by hashing the tokenizer's output on a fixed text
(`TextModel.get_vocab_base_pre`) and refuses unknown hashes. A synthetic release whose tokenizer.json differs from
the published Qwen3.5 file in a way that reaches that text would stop the conversion; only then is the name
`qwen35` used (the pre-tokenizer the Qwen3.5 tokenizer actually has). The patch lives in this process only: no
llama.cpp file is edited. `--report` records `{"pre_tokenizer": NAME, "forced": bool}`; the synthetic release of
this repository hashes to `qwen35` without the fallback.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", type=Path, required=True, help="the llama.cpp source tree (has convert_hf_to_gguf.py)")
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("--pre-tokenizer", default="qwen35", help="name used when the hash is unknown")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    script = args.llama_src / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise SystemExit(f"{script} not found")
    sys.path.insert(0, str(args.llama_src))
    sys.path.insert(1, str(args.llama_src / "gguf-py"))
    from conversion import base  # the converter's own package

    report = {"pre_tokenizer": None, "forced": False}
    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            report["pre_tokenizer"] = original(self, tokenizer)
        except NotImplementedError:
            print(f"[gguf_convert] unknown pre-tokenizer hash: using {args.pre_tokenizer!r}", file=sys.stderr)
            report["pre_tokenizer"] = args.pre_tokenizer
            report["forced"] = True
        return report["pre_tokenizer"]

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(script), *rest]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    args.report.write_text(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
