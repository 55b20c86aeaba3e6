#!/usr/bin/env python3
"""The llama.cpp peer of `kev bench backbone`: convert a base dir to GGUF once (cached), time prompt processing.

    python tools/bench/llama_cpp.py --llama-dir CACHE/llama.cpp --model BASE_DIR [--gguf-cache DIR] \
        --tokens 94,380,1518 --runs R [--threads 2] [--outtype bf16] --out FILE.json
    python tools/bench/llama_cpp.py --llama-dir CACHE/llama.cpp --gguf FILE.gguf ...      (no conversion)

Normally started by `llama_cpp.sh`, which builds llama.cpp first. Conversion: `convert_hf_to_gguf.py --outtype
bf16 --no-mtp` (the MTP block is a draft head no prefill runs) through `gguf_convert.py`, cached under
`--gguf-cache` keyed by the model directory's path and its files' names, sizes and mtimes. A base dir without
tokenizer files (a bare random-weight release) borrows the repository's synthetic Qwen3.5 tokenizer
(`--tokenizer-from`) in a staging directory of symlinks. Timing: one `llama-bench -m GGUF -p N1,N2,… -n 0 -t T
-r R -o json` process (llama-bench warms up once per test); the median of its `samples_ns` is the figure.
llama-bench fills its prompt with random token ids of its own: prompt-processing time does not depend on the ids,
only on the count. Its default batch (2048) and micro-batch (512) are kept, as a llama.cpp user would run it. Peak
RSS is llama-bench's own (wait4), weights memory-mapped. Output JSON:

    {"peer": "llama.cpp", "kind": "backbone", "outtype", "threads", "model", "gguf", "gguf_bytes", "converted",
     "convert_s", "pre_tokenizer", "pre_tokenizer_forced", "tokenizer_from", "peak_rss_bytes",
     "llama": {build_commit, cpu_info, model_type, model_n_params, n_batch, n_ubatch, flash_attn, …},
     "results": [{"tokens", "runs", "median_s", "min_s", "max_s", "samples_s", "tokens_per_s"}]}
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common as B  # noqa: E402

CONVERTER_TAG = "llama-cpp-python-0.3.36/0c1e57098"
KEEP = ("build_commit", "build_number", "cpu_info", "backends", "model_type", "model_size", "model_n_params",
        "n_batch", "n_ubatch", "n_threads", "type_k", "type_v", "flash_attn", "load_mode", "repack", "embeddings")


def find_source(llama_dir: Path) -> Path:
    found = sorted(llama_dir.glob("src/*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        raise SystemExit(f"no llama.cpp source under {llama_dir}/src (run tools/bench/setup.sh llama)")
    return found[-1].parent


def cache_key(model: Path, outtype: str) -> str:
    h = hashlib.sha256()
    h.update(f"{CONVERTER_TAG}\0{outtype}\0{model.resolve()}\0".encode())
    for f in sorted(model.iterdir()):
        if f.is_file() and (f.suffix in (".json", ".safetensors")):
            st = f.stat()
            h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def staged(model: Path, tokenizer_from: Path, stage: Path) -> Path:
    """The model directory as the converter needs it. A release without tokenizer files (a bare random-weight
    base) gets the repository's synthetic Qwen3.5 tokenizer: a directory of symlinks to the model's files plus the
    two tokenizer files. The tokenizer only names vocabulary entries in the GGUF; the timing does not depend on it.
    """
    if (model / "tokenizer.json").is_file():
        return model
    if not (tokenizer_from / "tokenizer.json").is_file():
        raise SystemExit(f"{model} has no tokenizer.json and {tokenizer_from} has none to lend")
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for f in model.iterdir():
        if f.is_file():
            (stage / f.name).symlink_to(f.resolve())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, stage / name)
    B.log(f"{model} has no tokenizer files: converting through {stage} with {tokenizer_from}'s")
    return stage


def convert(model: Path, src: Path, cache: Path, outtype: str, tokenizer_from: Path) -> tuple[Path, dict]:
    cache.mkdir(parents=True, exist_ok=True)
    key = cache_key(model, outtype)
    gguf = cache / f"{model.resolve().name}-{key}.{outtype}.gguf"
    meta_path = gguf.with_suffix(".json")
    if gguf.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        B.log(f"using the cached {gguf} (converted in {meta.get('convert_s', 0):.0f}s)")
        return gguf, {**meta, "converted": False}
    partial = gguf.with_name(gguf.name + ".partial")
    report = gguf.with_name(gguf.name + ".report.json")
    stage = gguf.with_name(gguf.name + ".stage")
    source = staged(model, tokenizer_from, stage)
    B.log(f"converting {model} to {outtype} GGUF with llama.cpp's convert_hf_to_gguf.py -> {gguf}")
    t = time.perf_counter()
    cmd = [sys.executable, str(HERE / "gguf_convert.py"), "--llama-src", str(src), "--report", str(report), "--",
           "--outtype", outtype, "--no-mtp", "--outfile", str(partial), str(source)]
    r = subprocess.run(cmd, stdout=sys.stderr)
    if source == stage:
        shutil.rmtree(stage, ignore_errors=True)
    if r.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"convert_hf_to_gguf.py failed (exit {r.returncode})")
    convert_s = time.perf_counter() - t
    partial.replace(gguf)
    rep = json.loads(report.read_text())
    report.unlink(missing_ok=True)
    meta = {"model": str(model.resolve()), "outtype": outtype, "convert_s": convert_s,
            "pre_tokenizer": rep["pre_tokenizer"], "pre_tokenizer_forced": rep["forced"], "converter": CONVERTER_TAG,
            "tokenizer_from": str(tokenizer_from) if source == stage else None}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return gguf, {**meta, "converted": True}


def run_bench(bench: Path, gguf: Path, lengths: list[int], runs: int, threads: int) -> tuple[list[dict], int]:
    cmd = [str(bench), "-m", str(gguf), "-p", ",".join(map(str, lengths)), "-n", "0", "-t", str(threads),
           "-r", str(runs), "-o", "json"]
    B.log("running " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"llama-bench failed (exit {proc.returncode})")
    rows = json.loads(out)
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return rows, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-dir", type=Path, required=True, help="the llama.cpp cache dir written by setup.sh")
    src_group = ap.add_mutually_exclusive_group(required=True)
    src_group.add_argument("--model", type=Path, help="base model directory to convert")
    src_group.add_argument("--gguf", type=Path, help="an existing GGUF to time")
    ap.add_argument("--gguf-cache", type=Path, help="where converted GGUFs are kept (default LLAMA_DIR/../gguf)")
    ap.add_argument("--tokenizer-from", type=Path, default=HERE.parent.parent / "fixtures" / "release" / "base",
                    help="tokenizer files for a model dir that has none (default: the repository's synthetic ones)")
    ap.add_argument("--outtype", default="bf16", choices=["bf16", "f16", "f32", "q8_0"])
    ap.add_argument("--tokens", default="94,380,1518")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    lengths = B.parse_lengths(args.tokens)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    threads = args.threads or len(os.sched_getaffinity(0))
    bench = args.llama_dir / "build" / "bin" / "llama-bench"
    if not os.access(bench, os.X_OK):
        raise SystemExit(f"{bench} missing (run tools/bench/setup.sh llama)")

    if args.gguf:
        gguf, meta = args.gguf, {"converted": False, "convert_s": None, "pre_tokenizer": None}
    else:
        cache = args.gguf_cache or args.llama_dir.parent / "gguf"
        gguf, meta = convert(args.model, find_source(args.llama_dir), cache, args.outtype, args.tokenizer_from)

    rows, peak = run_bench(bench, gguf, lengths, args.runs, threads)
    by_len = {r["n_prompt"]: r for r in rows if r.get("n_gen") == 0}
    results = []
    for n in lengths:
        r = by_len.get(n)
        if r is None:
            raise SystemExit(f"llama-bench reported no pp{n} row")
        samples = [ns / 1e9 for ns in r["samples_ns"]]
        s = B.summarize(samples)
        results.append({"tokens": n, "runs": len(samples), **s, "tokens_per_s": n / s["median_s"]})
        B.log(f"pp{n}: median {s['median_s']:.3f}s over {len(samples)} runs")
    doc = {
        "peer": "llama.cpp",
        "kind": "backbone",
        "outtype": args.outtype if not args.gguf else None,
        "threads": threads,
        "model": str(args.model.resolve()) if args.model else None,
        "gguf": str(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "converted": meta["converted"],
        "convert_s": meta.get("convert_s"),
        "pre_tokenizer": meta.get("pre_tokenizer"),
        "pre_tokenizer_forced": meta.get("pre_tokenizer_forced", False),
        "tokenizer_from": meta.get("tokenizer_from"),
        "peak_rss_bytes": peak,
        "llama": {k: rows[0].get(k) for k in KEEP},
        "versions": B.versions(),
        "results": results,
    }
    B.write_json(args.out, doc)
    B.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
