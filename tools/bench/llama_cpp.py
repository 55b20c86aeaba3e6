#!/usr/bin/env python3
"""The llama.cpp-family peers of `kev bench backbone`: a base dir as a GGUF once (cached), prompt processing timed.

    python tools/bench/llama_cpp.py --llama-dir CACHE/llama.cpp --model BASE_DIR [--gguf-cache DIR] \
        --tokens 94,380,1518 --runs R [--threads 2] [--outtype bf16] --out FILE.json
    python tools/bench/llama_cpp.py --llama-dir CACHE/llama.cpp --gguf FILE.gguf ...      (no conversion)
    python tools/bench/llama_cpp.py --llama-dir CACHE/llama.cpp --model BASE_DIR --outtype q4_k_m \
        --bench-dir CACHE/ik_llama.cpp/build/bin --run-time-repack --peer ik_llama.cpp ...   (ik_llama.cpp)
    python tools/bench/llama_cpp.py --llama-dir D --model BASE_DIR --outtype q4_k_m --gguf-path-only

Normally started by `llama_cpp.sh`, which builds llama.cpp first. Conversion: `convert_hf_to_gguf.py --outtype
bf16 --no-mtp` (the MTP block is a draft head no prefill runs) through `gguf_convert.py`, cached under
`--gguf-cache` keyed by the model directory's path and its files' names, sizes and mtimes. `--outtype q4_k_m`
is not a converter type: the BF16 conversion (cached as above) is quantised by mainline's `llama-quantize ...
Q4_K_M` from `--llama-dir`, cached beside it. Every GGUF is mainline's: ik_llama.cpp (`--bench-dir` its build,
`--run-time-repack` its `-rtr 1`) times the same files, its own converter having no Qwen3.5 entry.
`--gguf-path-only` prints the cached GGUF's path for the arguments given and exits (the key logic, testable
without a build); `--no-bench` makes the GGUF (or finds it cached), prints its path and exits. A base dir without
tokenizer files (a bare random-weight release) borrows the repository's synthetic Qwen3.5 tokenizer
(`--tokenizer-from`) in a staging directory of symlinks. Timing: one `llama-bench -m GGUF -p N1,N2,… -n 0 -t T
-r R -o json [-rtr 1]` process (llama-bench warms up once per test); the median of its `samples_ns` is the figure.
llama-bench fills its prompt with random token ids of its own: prompt-processing time does not depend on the ids,
only on the count. Its default batch (2048) and micro-batch (512) are kept, as a llama.cpp user would run it. Peak
RSS is llama-bench's own (wait4), weights memory-mapped (with `-rtr 1` read into memory). Output JSON:

    {"peer": "llama.cpp" | "ik_llama.cpp", "kind": "backbone", "outtype", "run_time_repack", "threads", "model",
     "gguf", "gguf_bytes", "converted", "convert_s", "quantized_from", "quantize_s", "pre_tokenizer",
     "pre_tokenizer_forced", "tokenizer_from", "peak_rss_bytes",
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
# Quantisations made by llama-quantize from the BF16 conversion (the converter writes the others itself).
QUANTIZED = {"q4_k_m": "Q4_K_M"}
KEEP = ("build_commit", "build_number", "cpu_info", "backends", "model_type", "model_size", "model_n_params",
        "n_batch", "n_ubatch", "n_threads", "type_k", "type_v", "flash_attn", "load_mode", "repack", "embeddings")


def find_source(llama_dir: Path) -> Path:
    found = sorted(llama_dir.glob("src/*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        raise SystemExit(f"no llama.cpp source under {llama_dir}/src (run tools/bench/setup.sh llama)")
    return found[-1].parent


def cached_gguf(model: Path, cache: Path, outtype: str) -> Path:
    """Where the GGUF of `model` in `outtype` is cached: `<dir name>-<key>.<outtype>.gguf`."""
    return cache / f"{model.resolve().name}-{cache_key(model, outtype)}.{outtype}.gguf"


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
    gguf = cached_gguf(model, cache, outtype)
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


def quantize(model: Path, src: Path, cache: Path, outtype: str, tokenizer_from: Path,
             quantizer: Path) -> tuple[Path, dict]:
    """`outtype` of QUANTIZED: llama-quantize on the BF16 conversion (both cached)."""
    gguf = cached_gguf(model, cache, outtype)
    meta_path = gguf.with_suffix(".json")
    if gguf.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        B.log(f"using the cached {gguf} (quantised in {meta.get('quantize_s', 0):.0f}s)")
        return gguf, {**meta, "converted": False}
    if not os.access(quantizer, os.X_OK):
        raise SystemExit(f"{quantizer} missing (run tools/bench/setup.sh llama)")
    source, source_meta = convert(model, src, cache, "bf16", tokenizer_from)
    partial = gguf.with_name(gguf.name + ".partial")
    cmd = [str(quantizer), str(source), str(partial), QUANTIZED[outtype]]
    B.log("quantising: " + " ".join(cmd))
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=sys.stderr)
    if r.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"llama-quantize failed (exit {r.returncode})")
    quantize_s = time.perf_counter() - t
    partial.replace(gguf)
    meta = {**{k: source_meta.get(k) for k in ("model", "pre_tokenizer", "pre_tokenizer_forced", "converter",
                                                "tokenizer_from")},
            "outtype": outtype, "quantized_from": str(source), "quantize_s": quantize_s,
            "convert_s": source_meta.get("convert_s") if source_meta.get("converted") else None}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return gguf, {**meta, "converted": True}


def run_bench(bench: Path, gguf: Path, lengths: list[int], runs: int, threads: int,
              repack: bool) -> tuple[list[dict], int, str | None]:
    """llama-bench's rows, its peak RSS, and a note when it had to run without its default repacking.

    Mainline llama-bench repacks weights into its CPU "extra" buffers by default (AMX tiles where the CPU has
    them); on an AMX Sapphire Rapids class VM (2026-12-07) that crashes on the 9B Q8_0 GGUF (SIGSEGV at load).
    A run killed by a signal is tried once more with `--repack 0`, and the report says so: a user hitting the
    crash would do the same, and a missing row hides the peer's figure altogether.
    """
    cmd = [str(bench), "-m", str(gguf), "-p", ",".join(map(str, lengths)), "-n", "0", "-t", str(threads),
           "-r", str(runs), "-o", "json"]
    if repack:
        cmd += ["-rtr", "1"]
    note = None
    for attempt in range(2):
        B.log("running " + " ".join(cmd))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode < 0 and attempt == 0 and not repack:
            note = (f"llama-bench died by signal {-proc.returncode} with its default weight repacking; "
                    "timed again with --repack 0")
            B.log(note)
            cmd += ["--repack", "0"]
            continue
        break
    if proc.returncode != 0:
        raise SystemExit(f"llama-bench failed (exit {proc.returncode})")
    rows = json.loads(out)
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return rows, peak, note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-dir", type=Path, required=True, help="the llama.cpp cache dir written by setup.sh")
    src_group = ap.add_mutually_exclusive_group(required=True)
    src_group.add_argument("--model", type=Path, help="base model directory to convert")
    src_group.add_argument("--gguf", type=Path, help="an existing GGUF to time")
    ap.add_argument("--gguf-cache", type=Path, help="where converted GGUFs are kept (default LLAMA_DIR/../gguf)")
    ap.add_argument("--tokenizer-from", type=Path, default=HERE.parent.parent / "fixtures" / "release" / "base",
                    help="tokenizer files for a model dir that has none (default: the repository's synthetic ones)")
    ap.add_argument("--outtype", default="bf16", choices=["bf16", "f16", "f32", "q8_0", *QUANTIZED])
    ap.add_argument("--bench-dir", type=Path,
                    help="the build/bin holding the llama-bench to time (default LLAMA_DIR/build/bin; "
                         "ik_llama.cpp's for that peer)")
    ap.add_argument("--run-time-repack", action="store_true", help="llama-bench -rtr 1 (ik_llama.cpp)")
    ap.add_argument("--peer", default="llama.cpp", help="the peer's name in the answer")
    ap.add_argument("--gguf-path-only", action="store_true",
                    help="print the cached GGUF's path for --model/--outtype and exit")
    ap.add_argument("--no-bench", action="store_true",
                    help="make (or find) the cached GGUF, print its path and exit without timing")
    ap.add_argument("--tokens", default="94,380,1518")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--out", type=Path, help="the answer (required unless --gguf-path-only or --no-bench)")
    args = ap.parse_args()
    lengths = B.parse_lengths(args.tokens)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    threads = args.threads or len(os.sched_getaffinity(0))
    cache = args.gguf_cache or args.llama_dir.parent / "gguf"
    if args.gguf_path_only:
        if not args.model:
            ap.error("--gguf-path-only needs --model")
        print(cached_gguf(args.model, cache, args.outtype))
        return 0
    if not args.no_bench and not args.out:
        ap.error("--out is required")
    bench_dir = args.bench_dir or args.llama_dir / "build" / "bin"
    bench = bench_dir / "llama-bench"
    if not args.no_bench and not os.access(bench, os.X_OK):
        raise SystemExit(f"{bench} missing (run tools/bench/setup.sh llama or ik-llama)")

    if args.gguf:
        gguf, meta = args.gguf, {"converted": False, "convert_s": None, "pre_tokenizer": None}
    elif args.outtype in QUANTIZED:
        quantizer = args.llama_dir / "build" / "bin" / "llama-quantize"
        gguf, meta = quantize(args.model, find_source(args.llama_dir), cache, args.outtype, args.tokenizer_from,
                              quantizer)
    else:
        gguf, meta = convert(args.model, find_source(args.llama_dir), cache, args.outtype, args.tokenizer_from)

    if args.no_bench:
        print(gguf)
        return 0
    rows, peak, repack_note = run_bench(bench, gguf, lengths, args.runs, threads, args.run_time_repack)
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
        "peer": args.peer,
        "kind": "backbone",
        "outtype": args.outtype if not args.gguf else None,
        "run_time_repack": args.run_time_repack,
        "repack_fallback": repack_note,
        "threads": threads,
        "model": str(args.model.resolve()) if args.model else None,
        "gguf": str(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "converted": meta["converted"],
        "convert_s": meta.get("convert_s"),
        "quantized_from": meta.get("quantized_from"),
        "quantize_s": meta.get("quantize_s"),
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
