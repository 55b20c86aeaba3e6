"""Train more Kev adapters over kev-mini's base — what users' domain fine-tunes of Kev look like — and write
their releases and reference-arm answers under `fixtures/mini/adapters/` (the multi-adapter server's fixtures).

    python tools/reference/train_adapters.py [--mini fixtures/mini] [--threads 1]

Each adapter is a whole Kev release directory over the committed `fixtures/mini/base` (PEFT
`adapter_config.json` + `adapter_model.safetensors`, `head.pt`, tokenizer links): a fresh rank-16 LoRA (alpha 32,
all 12 target modules) and a head started from kev-mini's own, trained through PEFT on the training records of
its domain only (its families), the temperature fitted on its domain's dev records. Then the author's fp32
reference arm (unmerged LoRA) answers `REQUESTS` test requests of every family under each adapter, and the run
checks that each adapter's answers differ from kev-mini's and from the other adapter's (max |dp| > 0.05), so a
server that mixes adapters up fails the tests that read these answers.

Deterministic for a thread count (seeded, fixed batch order; `head.pt` via the fixed-id `torch.save`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import train_mini as M  # noqa: E402
from kevref import arms as A  # noqa: E402
from kevref import contract as C  # noqa: E402
from kevref import expected as E  # noqa: E402
from kevref import mini_data as D  # noqa: E402
from kevref import release as R  # noqa: E402

# name → (families trained on, seed). Disjoint domains, so the two adapters answer differently.
ADAPTERS = {
    "support": (("ticket", "review"), 101),
    "ops": (("route", "json", "urgency"), 202),
}
STAGE = {"epochs": 2, "lr": 3e-3, "batch": 16}
REQUESTS = 40


def train(base_dir: Path, head: R.PointerHead, rows: list, dev: list, seed: int):
    from peft import LoraConfig, get_peft_model

    text = R.load_text_model(base_dir, torch.float32)
    cfg = LoraConfig(r=R.LORA_R, lora_alpha=R.LORA_ALPHA, lora_dropout=0.0, bias="none",
                     target_modules=R.TARGET_MODULES, base_model_name_or_path=R.BASE_REPO, revision=R.BASE_REVISION,
                     init_lora_weights=True)
    torch.manual_seed(seed)
    pm = get_peft_model(text, cfg)
    params = [p for p in pm.parameters() if p.requires_grad] + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=STAGE["lr"], weight_decay=0.0)
    rng = random.Random(seed + 1)
    total = STAGE["epochs"] * -(-len(rows) // STAGE["batch"])
    step = 0
    for epoch in range(STAGE["epochs"]):
        pm.train()
        tot, n = 0.0, 0
        for batch in M.batches(rows, STAGE["batch"], rng):
            for g in opt.param_groups:
                g["lr"] = STAGE["lr"] * M.schedule(step, total, warm=20)
            hidden = pm(input_ids=M.tensors_of(batch), use_cache=False).last_hidden_state
            loss, _ = M.pointer_loss(hidden, batch, head)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            tot += float(loss) * len(batch)
            n += len(batch)
            step += 1
        M.log(f"epoch {epoch + 1}: train loss {tot / n:.4f}; dev acc {M.evaluate(pm, head, dev):.3f}")
    return pm


def head_from(path: Path) -> R.PointerHead:
    h = A.Head.load(path)
    module = R.PointerHead(h.wq.shape[1], h.head_dim)
    with torch.no_grad():
        module.q.weight.copy_(h.wq)
        module.q.bias.copy_(h.bq)
        module.k.weight.copy_(h.wk)
        module.k.bias.copy_(h.bk)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mini", type=Path, default=HERE.parent.parent / "fixtures" / "mini")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    mini: Path = args.mini
    base_dir, kev_dir = mini / "base", mini / "kev"
    splits = {name: [json.loads(line) for line in (mini / "data" / f"{name}.jsonl").open(encoding="utf-8")]
              for name in ("train", "dev", "test")}
    tok = C.KevTokenizer(kev_dir / "tokenizer.json")

    # The answered requests: the first test requests of each family, in test order.
    per_family = max(1, REQUESTS // len(D.FAMILIES))
    picked, seen = [], {}
    for r in splits["test"]:
        if seen.get(r["family"], 0) < per_family:
            seen[r["family"]] = seen.get(r["family"], 0) + 1
            picked.append(r)
    bodies = [(r["id"], json.dumps(r["request"], ensure_ascii=False).encode()) for r in picked]
    ok, bad = E.classify(bodies, kev_dir / "tokenizer.json")
    if bad:
        raise AssertionError(f"test requests rejected: {[b[0] for b in bad]}")

    out_root = mini / "adapters"
    answers = {}
    kev_records, _ = E.valid_records(base_dir, kev_dir, ok, arms=("reference",))
    answers["kev"] = [q["reference"] for rec in kev_records for q in rec["questions"]]
    for name, (families, seed) in ADAPTERS.items():
        M.log(f"adapter {name}: families {families}")
        rows = {s: M.rows_of(M.compile_split([r for r in splits[s] if r["family"] in families], tok))
                for s in ("train", "dev")}
        head = head_from(kev_dir / "head.pt")
        pm = train(base_dir, head, rows["train"], rows["dev"], seed)
        out = out_root / name
        M.save_adapter(pm, out)
        temperature = M.fit_temperature(pm, head, rows["dev"])
        M.write_head(head, temperature, out)
        del pm
        for f in ("tokenizer.json", "tokenizer_config.json"):
            R.link_or_write(out / f, "", mini.parent / "release" / "kev" / f)
        records, _ = E.valid_records(base_dir, out, ok, arms=("reference",),
                                     request_path=lambda n: f"data/test.jsonl#{n}")
        with open(out / "expected.jsonl", "w", encoding="utf-8") as f:
            for (rid, _, _), (_, body), rec in zip(ok, bodies, records):
                rec = {"id": rid, "body": body.decode(), **rec}
                del rec["request"], rec["hidden"]
                f.write(E.dumps(rec))
        answers[name] = [q["reference"] for rec in records for q in rec["questions"]]
        for p in out.rglob("*"):
            if p.is_file() and not p.is_symlink():
                p.chmod(0o644)

    names = list(answers)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            dp = max(max(abs(x - y) for x, y in zip(p, q)) for p, q in zip(answers[a], answers[b]))
            M.log(f"max |dp| {a} vs {b}: {dp:.4f}")
            if dp < 0.05:
                raise AssertionError(f"adapters {a} and {b} answer alike (max |dp| {dp})")
    M.log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
