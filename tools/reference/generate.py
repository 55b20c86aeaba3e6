#!/usr/bin/env python3
"""Regenerate every fixture under --out (default: fixtures/): tokenizers, the synthetic releases (seed 1 and the
seed-2 "wrong model"), the requests, the reference arm's expected outputs, golden vectors, merge/head digests.

    python tools/reference/generate.py --out fixtures

Deterministic: seeded, one torch thread, fixed zip metadata in head.pt; two runs give byte-identical trees.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from kevref import arms as A  # noqa: E402
from kevref import contract as C  # noqa: E402
from kevref import expected as E  # noqa: E402
from kevref import golden  # noqa: E402
from kevref import release as R  # noqa: E402
from kevref import requests_set as RS  # noqa: E402
from kevref import tokcheck  # noqa: E402
from kevref import tokenizer_build as TB  # noqa: E402

GENERATED = ("release", "release-wrong", "requests", "expected")
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def sha256_tensor(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        raw = t.view(torch.int16).numpy().tobytes()
    else:
        raw = t.numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()


DTYPE_NAME = {torch.bfloat16: "BF16", torch.float32: "F32"}


def write_tokenizers(out: Path, verify: bool) -> dict[str, Path]:
    ranks = TB.load_ranks()
    merges = TB.recover_merges(ranks)
    paths = {}
    docs = tokcheck.corpus() if verify else None
    for variant in ("base", "kev"):
        text = TB.build_tokenizer_json(variant, ranks, merges)
        TB.check_tokenizer(variant, text)
        if verify:
            stats = tokcheck.check(text, variant, docs)
            log(f"tokenizer {variant}: agrees with tiktoken on {stats['chars']:,} chars / {stats['tokens']:,} tokens")
        d = out / "release" / variant
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer.json").write_text(text, encoding="utf-8")
        (d / "tokenizer_config.json").write_text(TB.tokenizer_config(variant), encoding="utf-8")
        paths[variant] = d / "tokenizer.json"
    if verify:
        TB.check_transformers_rebuild(paths["base"].parent, paths["kev"].read_text(encoding="utf-8"))
        log("tokenizer kev: equals transformers' Qwen2Tokenizer rebuild of the base files")
    log(f"tokenizers: {len(merges):,} merges")
    return paths


def write_release(out: Path, name: str, seed: int, tokenizer_from: Path | None) -> None:
    root = out / name
    R.write_base(root / "base", seed)
    R.write_adapter(root / "base", root / "kev", seed)
    R.write_head(root / "kev", seed)
    for variant in ("base", "kev"):
        if tokenizer_from is not None:
            R.link_or_write(root / variant / "tokenizer.json", "", tokenizer_from / variant / "tokenizer.json")
            (root / variant / "tokenizer_config.json").write_text(TB.tokenizer_config(variant), encoding="utf-8")
    # A stable file mode (safetensors' writer creates 0600 files).
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            p.chmod(0o644)
    log(f"release {name}: seed {seed}")


def merge_manifest(base_dir: Path, kev_dir: Path) -> dict:
    """expected/merge.json: PEFT's own merge on the fp32-loaded base, one cast to bf16; copied tensors as stored."""
    from peft import PeftModel
    from safetensors import safe_open

    stored = {}
    for shard in sorted(base_dir.glob("model.safetensors-*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for k in f.keys():
                stored[k] = f.get_tensor(k)
    text = R.load_text_model(base_dir, torch.float32)
    merged = PeftModel.from_pretrained(text, str(kev_dir)).merge_and_unload().state_dict()
    adapted = set(A.adapted_names(kev_dir))
    lora = {}
    with safe_open(str(kev_dir / "adapter_model.safetensors"), "pt") as f:
        for short in adapted:
            key = "base_model.model." + short.removesuffix(".weight")
            lora[short] = (f.get_tensor(key + ".lora_A.weight"), f.get_tensor(key + ".lora_B.weight"))
    ac = json.loads((kev_dir / "adapter_config.json").read_text())
    scale = ac["lora_alpha"] / ac["r"]
    tensors = {}
    n_adapted = n_copied = 0
    for name in sorted(stored):
        if name.startswith("mtp."):
            continue  # the export drops the MTP head (release-pins.md: a known good merged artifact)
        short = name.removeprefix(R.PREFIX)
        is_merged = name.startswith(R.PREFIX) and short in adapted
        if is_merged:
            t = merged[short].to(torch.bfloat16)
            # The same merge with an exact (float64) B@A must give the same bits: the fixture's LoRA grid makes
            # the merge independent of summation order (see release.write_adapter).
            a, b = lora[short]
            exact = (b.double() @ a.double()).float() * scale
            if not torch.equal((stored[name].float() + exact).to(torch.bfloat16), t):
                raise AssertionError(f"{name}: PEFT's merge depends on the summation order")
            n_adapted += 1
        else:
            t = stored[name]
            if name.startswith(R.PREFIX) and not torch.equal(merged[short], t.float()):
                raise AssertionError(f"{name}: copied tensor changed in the merge")
            n_copied += 1
        tensors[name] = {"sha256": sha256_tensor(t), "dtype": DTYPE_NAME[t.dtype], "shape": list(t.shape),
                         "merged": is_merged}
    if n_adapted != len(adapted):
        raise AssertionError("not every adapted module was found in the base")
    return {"lora_alpha": ac["lora_alpha"], "r": ac["r"], "scale": scale, "adapted": n_adapted, "copied": n_copied,
            "tensors": tensors}


def head_manifest(kev_dir: Path) -> dict:
    d = torch.load(str(kev_dir / "head.pt"), map_location="cpu", weights_only=True)
    return {
        "temperature": d["temperature"],
        "head_dim": d["head_dim"],
        "scale": d["head_dim"] ** -0.5,
        "meta": {k: v for k, v in d.items() if k not in ("head", "temperature", "head_dim")},
        "tensors": {k: {"sha256": sha256_tensor(v.float()), "dtype": "F32", "shape": list(v.shape)}
                    for k, v in d["head"].items()},
    }


def self_checks(base_dir: Path, kev_dir: Path, ok: list, records: list[dict]) -> dict:
    """The reference arm applies the LoRA (it moves outputs) and agrees with PEFT's fp32 merge (unrounded)."""
    from peft import PeftModel

    head = A.Head.load(kev_dir / "head.pt")
    plain = R.load_text_model(base_dir, torch.float32)
    merged = PeftModel.from_pretrained(R.load_text_model(base_dir, torch.float32), str(kev_dir)).merge_and_unload()
    d_merge = d_nolora = 0.0
    for (name, _, c), rec in list(zip(ok, records))[:12]:
        for q, eq in zip(c.questions, rec["questions"]):
            p_m = head.probs(A.row_hidden(merged, q.row_ids), q.option_ends, q.decide)
            p_0 = head.probs(A.row_hidden(plain, q.row_ids), q.option_ends, q.decide)
            d_merge = max(d_merge, max(abs(a - b) for a, b in zip(eq["reference"], p_m)))
            d_nolora = max(d_nolora, max(abs(a - b) for a, b in zip(eq["reference"], p_0)))
    if d_merge > 1e-4:
        raise AssertionError(f"reference arm vs fp32 merge: max |dp| {d_merge}")
    if d_nolora < 0.05:
        raise AssertionError(f"the LoRA hardly moves the outputs (max |dp| {d_nolora})")
    return {"reference_vs_fp32_merge_max_dp": d_merge, "reference_vs_no_lora_max_dp": d_nolora}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE.parent.parent / "fixtures")
    ap.add_argument("--skip-tokcheck", action="store_true",
                    help="skip the (≈ 40 s) tiktoken and transformers cross-checks of the tokenizer files")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for sub in GENERATED:
        if (out / sub).exists():
            shutil.rmtree(out / sub)

    tok_paths = write_tokenizers(out, verify=not args.skip_tokcheck)
    exp = out / "expected"
    exp.mkdir(parents=True)
    n = golden.write(exp / "golden.json", tok_paths)
    log(f"golden vectors: {n}/31 input_tokens reproduced with both tokenizers")

    write_release(out, "release", 1, None)
    write_release(out, "release-wrong", 2, out / "release")
    base_dir, kev_dir = out / "release" / "base", out / "release" / "kev"

    tok = C.KevTokenizer(kev_dir / "tokenizer.json")
    valid_bodies = [(n_, RS.body_bytes(b)) for n_, b in RS.valid(tok)]
    invalid_bodies = [(n_, RS.body_bytes(b)) for n_, b in RS.invalid(tok)]
    for kind, bodies in (("valid", valid_bodies), ("invalid", invalid_bodies)):
        d = out / "requests" / kind
        d.mkdir(parents=True)
        names = [n_ for n_, _ in bodies]
        if len(set(names)) != len(names):
            raise AssertionError(f"duplicate {kind} request names")
        for n_, raw in bodies:
            (d / f"{n_}.json").write_bytes(raw)

    ok, bad = E.classify(valid_bodies, kev_dir / "tokenizer.json")
    if bad:
        raise AssertionError(f"valid requests rejected: {[b[0] for b in bad]}")
    ok_i, bad_i = E.classify(invalid_bodies, kev_dir / "tokenizer.json")
    if ok_i:
        raise AssertionError(f"invalid requests accepted: {[o[0] for o in ok_i]}")
    (exp / "invalid").mkdir()
    for n_, status, body in bad_i:
        if status != 422:
            raise AssertionError(f"{n_}: status {status}")
        (exp / "invalid" / f"{n_}.json").write_text(E.dumps({"status": status, "body": body}), encoding="utf-8")
    log(f"requests: {len(ok)} valid, {len(bad_i)} invalid")

    hidden_names = set(RS.HIDDEN_SUBSET)
    missing = hidden_names - {n_ for n_, _, _ in ok}
    if missing:
        raise AssertionError(f"hidden subset names not in the valid set: {missing}")
    records, hidden = E.valid_records(base_dir, kev_dir, ok, hidden_names=hidden_names, log=log)
    (exp / "valid").mkdir()
    (exp / "hidden").mkdir()
    from safetensors.torch import save_file

    for (n_, _, _), rec in zip(ok, records):
        (exp / "valid" / f"{n_}.json").write_text(E.dumps(rec), encoding="utf-8")
        if n_ in hidden:
            save_file(hidden[n_], str(exp / "hidden" / f"{n_}.safetensors"))
    checks = self_checks(base_dir, kev_dir, ok, records)
    log(f"self-checks: {checks}")

    (exp / "merge.json").write_text(json.dumps(merge_manifest(base_dir, kev_dir), indent=1) + "\n")
    (exp / "head.json").write_text(json.dumps(head_manifest(kev_dir), indent=1) + "\n")
    for p in (out / "expected").rglob("*"):
        if p.is_file():
            p.chmod(0o644)

    # The spread the fixtures exercise (printed, not stored).
    mx = [max(q["reference"]) for r in records for q in r["questions"] if len(q["reference"]) > 1]
    hist = [0] * 10
    for m in mx:
        hist[min(int(m * 10), 9)] += 1
    log(f"max-probability histogram over {len(mx)} multi-option questions (0.0–1.0 in tenths): {hist}")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
