#!/usr/bin/env python3
"""Train kev-mini — a miniature Kev in the real release formats — and write `fixtures/mini/`.

    python tools/reference/train_mini.py --out fixtures/mini [--threads 2]

1. Data: `kevref.mini_data` (seeded; train / dev / test split by template) → `data/{train,dev,test}.jsonl`.
2. Rows exactly as Kev builds them (`kevref.contract.compile_request`, the Kev-variant tokenizer of
   `fixtures/release/kev`): `[<|fim_prefix|>] state [<|fim_middle|>] instructions …options… [<|fim_suffix|>]`.
3. Stage 1, the "base": a small Qwen3.5 (real head shapes, 3 Gated DeltaNet : 1 attention) trained in full with the
   pointer head (q/k 256-d, bias, fp32) on the final-norm hidden states, softmax cross-entropy over each question's
   options. Trained over the vocabulary that occurs in the training rows; every other embedding row is zero in the
   release (so the files compress). Stored BF16 like the real base (A_log and the gated norm in F32).
4. Stage 2, "kev": a rank-16 LoRA (alpha 32) over all 12 target modules plus the head, trained through PEFT on the
   stored (bf16-rounded) base. Then the temperature is fitted on the dev split and stored in `head.pt`.
5. The reference arms (`kevref.arms`: fp32 unmerged LoRA, merged bf16, torch bf16) on the test split and the README
   example → `expected/`.

Deterministic for a thread count: seeded, fixed batch order; `head.pt` via the fixed-id `torch.save`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
import warnings
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from kevref import arms as A  # noqa: E402
from kevref import contract as C  # noqa: E402
from kevref import expected as E  # noqa: E402
from kevref import mini_data as D  # noqa: E402
from kevref import release as R  # noqa: E402

T0 = time.time()
HEAD_DIM = 256
SEED = 14

TEXT_CONFIG = {
    **R.TEXT_CONFIG,
    "head_dim": 256,
    "hidden_size": 64,
    "intermediate_size": 192,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_value_head_dim": 128,
    "num_attention_heads": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 1,
    "rope_parameters": {
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rope_type": "default",
    },
}

STAGE1 = {"epochs": 3, "lr": 2e-3, "batch": 16}
STAGE2 = {"epochs": 1, "lr": 2e-3, "batch": 16}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------------- rows


class Row:
    __slots__ = ("ids", "ends", "decide", "label")

    def __init__(self, ids, ends, decide, label):
        self.ids, self.ends, self.decide, self.label = ids, ends, decide, label


def compile_split(records: list[dict], tok: C.KevTokenizer) -> list[tuple[dict, C.Compiled]]:
    return [(r, C.compile_request(r["request"], tok)) for r in records]


def rows_of(compiled: list[tuple[dict, C.Compiled]]) -> list[Row]:
    out = []
    for rec, c in compiled:
        for q in c.questions:
            out.append(Row(q.row_ids, q.option_ends, q.decide, q.keys.index(rec["labels"][q.qid])))
    return out


def batches(rows: list[Row], size: int, rng: random.Random) -> list[list[Row]]:
    """Length-bucketed batches in a seeded order."""
    order = list(range(len(rows)))
    rng.shuffle(order)
    # sort within windows of 8 batches so padding stays small but batches still mix
    win = size * 8
    out = []
    for s in range(0, len(order), win):
        chunk = sorted(order[s : s + win], key=lambda i: len(rows[i].ids))
        out += [[rows[i] for i in chunk[b : b + size]] for b in range(0, len(chunk), size)]
    rng.shuffle(out)
    return out


def tensors_of(batch: list[Row], remap=None):
    n = max(len(r.ids) for r in batch)
    ids = torch.zeros((len(batch), n), dtype=torch.long)
    for b, r in enumerate(batch):
        row = [remap.get(t, 0) for t in r.ids] if remap is not None else r.ids
        ids[b, : len(row)] = torch.tensor(row)
        if remap is None:
            ids[b, len(row):] = r.ids[-1]
    return ids


def pointer_loss(hidden, batch: list[Row], head: R.PointerHead, temperature: float = 1.0):
    """Mean cross-entropy over the batch's questions, and the number of argmax hits."""
    losses, hits = [], 0
    for b, r in enumerate(batch):
        h = hidden[b]
        q = head.q(h[r.decide])
        k = head.k(h[r.ends])
        z = (k @ q) * (HEAD_DIM ** -0.5) / temperature
        losses.append(torch.nn.functional.cross_entropy(z[None], torch.tensor([r.label])))
        hits += int(int(torch.argmax(z)) == r.label)
    return torch.stack(losses).mean(), hits


def schedule(step: int, total: int, warm: int = 40) -> float:
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))) * 0.95 + 0.05


# ---------------------------------------------------------------------------------------------------- stage 1


def text_config(vocab: int):
    from transformers import Qwen3_5TextConfig

    cfg = {k: v for k, v in TEXT_CONFIG.items() if k not in ("model_type", "dtype")}
    cfg["vocab_size"] = vocab
    return Qwen3_5TextConfig(**cfg)


def train_base(train_rows: list[Row], dev_rows: list[Row], used: list[int]):
    from transformers import Qwen3_5TextModel

    remap = {t: i + 1 for i, t in enumerate(used)}  # compact id 0: every token never seen in training (zero row)
    torch.manual_seed(SEED)
    model = Qwen3_5TextModel(text_config(len(used) + 1)).float()
    d = TEXT_CONFIG["hidden_size"]
    # transformers' own init (N(0, 0.02) linears and embedding, zero (1+w) norms), except the Gated DeltaNet decay:
    # its default A (up to 16, with dt_bias 1) forgets everything within a token or two, so nothing but the one
    # attention layer could carry the question to the state; A ∈ [0.01, 0.5] with dt_bias −1 remembers ~5–300 tokens.
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        model.embed_tokens.weight[0].zero_()
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 0.49 + 0.01))
            elif name.endswith("linear_attn.dt_bias"):
                p.fill_(-1.0)
    head = R.PointerHead(d, HEAD_DIM)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=STAGE1["lr"], weight_decay=0.01)
    rng = random.Random(SEED)
    total = STAGE1["epochs"] * math.ceil(len(train_rows) / STAGE1["batch"])
    step, win = 0, []
    for epoch in range(STAGE1["epochs"]):
        model.train()
        tot, hits, n = 0.0, 0, 0
        for batch in batches(train_rows, STAGE1["batch"], rng):
            for g in opt.param_groups:
                g["lr"] = STAGE1["lr"] * schedule(step, total)
            ids = tensors_of(batch, remap)
            hidden = model(input_ids=ids, use_cache=False).last_hidden_state
            loss, h = pointer_loss(hidden, batch, head)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            with torch.no_grad():
                model.embed_tokens.weight[0].zero_()
            tot += float(loss) * len(batch)
            hits += h
            n += len(batch)
            step += 1
            win.append((float(loss), h, len(batch)))
            if step % 25 == 0:
                wl = sum(x[0] for x in win[-25:]) / len(win[-25:])
                wa = sum(x[1] for x in win[-25:]) / sum(x[2] for x in win[-25:])
                log(f"stage 1 step {step}/{total}: last 25 steps loss {wl:.4f} acc {wa:.3f}")
        acc = evaluate(model, head, dev_rows, remap)
        log(f"stage 1 epoch {epoch + 1}: train loss {tot / n:.4f} acc {hits / n:.3f}; dev acc {acc:.3f}")
    return model, head, remap


@torch.no_grad()
def evaluate(model, head, rows: list[Row], remap=None) -> float:
    model.eval()
    hits = 0
    for s in range(0, len(rows), 64):
        batch = rows[s : s + 64]
        hidden = model(input_ids=tensors_of(batch, remap), use_cache=False).last_hidden_state
        hits += pointer_loss(hidden, batch, head)[1]
    return hits / len(rows)


# ---------------------------------------------------------------------------------------------------- release


def config_json() -> dict:
    cfg = R.config_json()
    cfg["text_config"] = TEXT_CONFIG
    cfg["vision_config"] = {**R.VISION_CONFIG, "out_hidden_size": TEXT_CONFIG["hidden_size"]}
    return cfg


def extra_tensors() -> "OrderedDict[str, torch.Tensor]":
    """A tiny vision tower (real names) and the 15 MTP tensors at the mini's widths, all zero: loaders of the text
    backbone skip both, and zeros cost nothing in git."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    vcfg = config_json()["vision_config"]
    vc = Qwen3_5VisionConfig(**{k: v for k, v in vcfg.items() if k != "model_type"})
    with torch.device("meta"):
        vm = Qwen3_5VisionModel(vc)
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for n, p in vm.state_dict().items():
        out["model.visual." + n] = torch.zeros(tuple(p.shape), dtype=torch.bfloat16)
    h, i, hd = TEXT_CONFIG["hidden_size"], TEXT_CONFIG["intermediate_size"], TEXT_CONFIG["head_dim"]
    nh, nkv = TEXT_CONFIG["num_attention_heads"], TEXT_CONFIG["num_key_value_heads"]
    mtp = {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.layers.0.input_layernorm.weight": (h,),
        "mtp.layers.0.mlp.down_proj.weight": (h, i),
        "mtp.layers.0.mlp.gate_proj.weight": (i, h),
        "mtp.layers.0.mlp.up_proj.weight": (i, h),
        "mtp.layers.0.post_attention_layernorm.weight": (h,),
        "mtp.layers.0.self_attn.k_norm.weight": (hd,),
        "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, h),
        "mtp.layers.0.self_attn.o_proj.weight": (h, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": (hd,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * nh * hd, h),
        "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, h),
        "mtp.norm.weight": (h,),
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
    }
    for name, shape in mtp.items():
        out[name] = torch.zeros(shape, dtype=torch.bfloat16)
    return out


def write_base(model, remap: dict[int, int], out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for n, t in model.state_dict().items():
        t = t.detach().float()
        if n == "embed_tokens.weight":
            full = torch.zeros((R.VOCAB, t.shape[1]), dtype=torch.float32)
            ids = torch.tensor(sorted(remap))
            full[ids] = t[torch.tensor([remap[i] for i in sorted(remap)])]
            t = full
        name = R.PREFIX + n
        state[name] = t.to(R.storage_dtype(name)).contiguous()
    state.update(extra_tensors())
    names = sorted(state)
    first = [n for n in names if n == R.PREFIX + "embed_tokens.weight" or any(
        n.startswith(f"{R.PREFIX}layers.{i}.") for i in range(2))]
    second = [n for n in names if n not in set(first)]
    weight_map, total = {}, 0
    for k, group in enumerate([first, second], start=1):
        fname = f"model.safetensors-{k:05d}-of-00002.safetensors"
        save_file({n: state[n] for n in group}, str(out / fname), metadata={"format": "pt"})
        for n in group:
            weight_map[n] = fname
            total += state[n].numel() * state[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (out / "config.json").write_text(json.dumps(config_json(), indent=2, sort_keys=True) + "\n")


def train_kev(base_dir: Path, head: R.PointerHead, train_rows: list[Row], dev_rows: list[Row]):
    from peft import LoraConfig, get_peft_model

    text = R.load_text_model(base_dir, torch.float32)
    cfg = LoraConfig(r=R.LORA_R, lora_alpha=R.LORA_ALPHA, lora_dropout=0.0, bias="none",
                     target_modules=R.TARGET_MODULES, base_model_name_or_path=R.BASE_REPO, revision=R.BASE_REVISION,
                     init_lora_weights=True)
    torch.manual_seed(SEED + 1)
    pm = get_peft_model(text, cfg)
    base_acc = evaluate(pm, head, dev_rows)
    log(f"stage 2: dev acc before the LoRA {base_acc:.3f}")
    params = [p for p in pm.parameters() if p.requires_grad] + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=STAGE2["lr"], weight_decay=0.0)
    rng = random.Random(SEED + 2)
    total = STAGE2["epochs"] * math.ceil(len(train_rows) / STAGE2["batch"])
    step = 0
    for epoch in range(STAGE2["epochs"]):
        pm.train()
        tot, hits, n = 0.0, 0, 0
        for batch in batches(train_rows, STAGE2["batch"], rng):
            for g in opt.param_groups:
                g["lr"] = STAGE2["lr"] * schedule(step, total, warm=20)
            hidden = pm(input_ids=tensors_of(batch), use_cache=False).last_hidden_state
            loss, h = pointer_loss(hidden, batch, head)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            tot += float(loss) * len(batch)
            hits += h
            n += len(batch)
            step += 1
            if step % 25 == 0:
                log(f"stage 2 step {step}/{total}: loss {tot / n:.4f} acc {hits / n:.3f}")
        acc = evaluate(pm, head, dev_rows)
        log(f"stage 2 epoch {epoch + 1}: train loss {tot / n:.4f} acc {hits / n:.3f}; dev acc {acc:.3f}")
    return pm


def save_adapter(pm, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    pm.save_pretrained(str(out))
    readme = out / "README.md"
    if readme.exists():
        readme.unlink()
    cfg_path = out / "adapter_config.json"
    ac = json.loads(cfg_path.read_text())
    ac["base_model_name_or_path"] = R.BASE_REPO
    ac["target_modules"] = sorted(ac["target_modules"])
    cfg_path.write_text(json.dumps(ac, indent=2, sort_keys=True))


@torch.no_grad()
def fit_temperature(pm, head: R.PointerHead, rows: list[Row]) -> float:
    """argmin over T of the dev split's mean NLL (float64 golden-section search on log T)."""
    pm.eval()
    logits, labels = [], []
    for s in range(0, len(rows), 64):
        batch = rows[s : s + 64]
        hidden = pm(input_ids=tensors_of(batch), use_cache=False).last_hidden_state
        for b, r in enumerate(batch):
            h = hidden[b]
            z = (head.k(h[r.ends]) @ head.q(h[r.decide])) * (HEAD_DIM ** -0.5)
            logits.append(z.double())
            labels.append(r.label)

    def nll(log_t: float) -> float:
        t = math.exp(log_t)
        return sum(float(-torch.log_softmax(z / t, -1)[y]) for z, y in zip(logits, labels)) / len(labels)

    lo, hi = math.log(0.05), math.log(20.0)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(b)
    t = math.exp((lo + hi) / 2)
    log(f"temperature {t:.4f}: dev NLL {nll(0.0):.4f} at T=1 → {nll(math.log(t)):.4f}")
    return t


def write_head(head: R.PointerHead, temperature: float, out: Path) -> None:
    state = head.state_dict()
    for k in state:
        state[k] = state[k].detach().float().contiguous()
    payload = {
        "base": R.BASE_REPO,
        "base_revision": R.BASE_REVISION,
        "lora": R.LORA_R,
        "head_dim": HEAD_DIM,
        "option_isolation": False,
        "special_embeddings": False,
        "weights_dtype": "bfloat16",
        "temperature": float(temperature),
        "lora_placement": "all",
        "head": state,
    }
    R.deterministic_torch_save(payload, out / "head.pt")


# ---------------------------------------------------------------------------------------------------- arms


def accuracy(records: list[dict], arm: str) -> tuple[float, float, int]:
    """(accuracy, chance, questions) of one arm over expected records carrying labels."""
    hits, chance, n = 0, 0.0, 0
    for r in records:
        for q in r["questions"]:
            p = q[arm]
            hits += int(q["keys"][max(range(len(p)), key=p.__getitem__)] == q["label"])
            chance += 1 / len(p)
            n += 1
    return hits / n, chance / n, n


def distances(records: list[dict], arm: str) -> dict:
    mx, means, flips, checked = 0.0, [], 0, 0
    for r in records:
        for q in r["questions"]:
            ref, got = q["reference"], q[arm]
            d = [abs(a - b) for a, b in zip(ref, got)]
            mx = max(mx, max(d))
            means.append(sum(d) / len(d))
            s = sorted(ref, reverse=True)
            if len(ref) > 1 and s[0] - s[1] > 0.02:
                checked += 1
                flips += int(max(range(len(ref)), key=ref.__getitem__) != max(range(len(got)), key=got.__getitem__))
    return {"max_dp": mx, "mean_dp": sum(means) / len(means), "argmax_flips": flips, "margin_checked": checked}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE.parent.parent / "fixtures" / "mini")
    ap.add_argument("--tokenizers", type=Path, default=HERE.parent.parent / "fixtures" / "release",
                    help="the release whose tokenizer files kev-mini links to (the synthetic release's)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="check the pipeline on 48 training records, 1 epoch each")
    ap.add_argument("--keep-release", action="store_true",
                    help="keep the base/ and kev/ already in --out (no training): rewrite data/ and expected/ only; "
                         "train and dev must come out byte-identical to the stored ones, the weights' inputs")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    out: Path = args.out
    kept = None
    if args.keep_release:
        if args.smoke:
            raise SystemExit("--keep-release and --smoke do not go together")
        kept = {name: (out / "data" / f"{name}.jsonl").read_bytes() for name in ("train", "dev")}
        old_summary = json.loads((out / "expected" / "summary.json").read_text())
        for d in ("data", "expected"):
            shutil.rmtree(out / d)
    elif out.exists():
        shutil.rmtree(out)
    (out / "data").mkdir(parents=True)

    if args.smoke:  # a quick run of the whole pipeline on a few records (not the fixture)
        STAGE1["epochs"] = STAGE2["epochs"] = 1
        splits = D.generate(SEED, {"train": 48, "dev": 16, "test": 16})
    else:
        splits = D.generate(SEED)
    for name, recs in splits.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()
        if kept is not None and name in kept and text != kept[name]:
            raise AssertionError(f"--keep-release: data/{name}.jsonl would change, and the stored weights were "
                                 "trained on the old one (retrain without --keep-release)")
        (out / "data" / f"{name}.jsonl").write_bytes(text)
    tok_kev = args.tokenizers / "kev" / "tokenizer.json"
    tok = C.KevTokenizer(tok_kev)
    compiled = {name: compile_split(recs, tok) for name, recs in splits.items()}
    rows = {name: rows_of(c) for name, c in compiled.items()}
    used = sorted({t for r in rows["train"] for t in r.ids})
    log(f"data: {', '.join(f'{k} {len(v)} requests / {len(rows[k])} rows' for k, v in splits.items())}; "
        f"{len(used)} token ids in training")

    base_dir, kev_dir = out / "base", out / "kev"
    if kept is not None:
        temperature = A.Head.load(kev_dir / "head.pt").temperature
        log(f"release kept (temperature {temperature:.4f})")
    else:
        model, head, remap = train_base(rows["train"], rows["dev"], used)
        write_base(model, remap, base_dir)
        del model
        log("base written")

        pm = train_kev(base_dir, head, rows["train"], rows["dev"])
        save_adapter(pm, kev_dir)
        temperature = fit_temperature(pm, head, rows["dev"])
        write_head(head, temperature, kev_dir)
        del pm
    for variant in ("base", "kev"):
        R.link_or_write(out / variant / "tokenizer.json", "", args.tokenizers / variant / "tokenizer.json")
        R.link_or_write(out / variant / "tokenizer_config.json", "",
                        args.tokenizers / variant / "tokenizer_config.json")
    for p in out.rglob("*"):
        if p.is_file() and not p.is_symlink():
            p.chmod(0o644)
    train_s = time.time() - T0
    log(f"release written ({train_s:.0f}s since start)")

    # The reference arms on the test split and the README example.
    bodies = [(r["id"], json.dumps(r["request"], ensure_ascii=False).encode()) for r in splits["test"]]
    readme = {"state": D.README_STATE, "questions": D.README_QUESTIONS}
    bodies.append(("readme-example", json.dumps(readme, ensure_ascii=False).encode()))
    ok, bad = E.classify(bodies, kev_dir / "tokenizer.json")
    if bad:
        raise AssertionError(f"test requests rejected: {[b[0] for b in bad]}")
    records, _ = E.valid_records(base_dir, kev_dir, ok, request_path=lambda n: f"data/test.jsonl#{n}", log=log)
    labels = {r["id"]: r["labels"] for r in splits["test"]}
    labels["readme-example"] = D.README_LABELS
    exp = out / "expected"
    exp.mkdir()
    test_records = []
    for (name, _, _), body, rec in zip(ok, [b for _, b in bodies], records):
        rec = {"id": name, "body": body.decode(), **rec}
        del rec["request"], rec["hidden"]
        for q in rec["questions"]:
            q["label"] = labels[name][q["id"]]
        if name == "readme-example":
            (exp / "readme-example.json").write_text(E.dumps(rec), encoding="utf-8")
        else:
            test_records.append(rec)
    with open(exp / "test.jsonl", "w", encoding="utf-8") as f:
        for rec in test_records:
            f.write(E.dumps(rec))

    # The adapter moves answers: the same head on the base alone.
    head_t = A.Head.load(kev_dir / "head.pt")
    plain = R.load_text_model(base_dir, torch.float32)
    no_lora = []
    for (name, _, c) in ok:
        if name == "readme-example":
            continue
        for q in c.questions:
            no_lora.append(head_t.probs(A.row_hidden(plain, q.row_ids), q.option_ends, q.decide))
    flat_ref = [q["reference"] for r in test_records for q in r["questions"]]
    lora_dp = max(max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(flat_ref, no_lora))
    lora_hits = sum(int(q["keys"][max(range(len(p)), key=p.__getitem__)] == q["label"])
                    for q, p in zip([q for r in test_records for q in r["questions"]], no_lora))
    acc, chance, n = accuracy(test_records, "reference")
    summary = {
        "test_questions": n,
        "accuracy": {arm: accuracy(test_records, arm)[0] for arm in A.ARMS},
        "accuracy_without_lora": lora_hits / n,
        "chance": chance,
        "temperature": temperature,
        "vs_reference": {arm: distances(test_records, arm) for arm in ("merged_bf16", "torch_bf16")},
        "lora_max_dp": lora_dp,
        "train_tokens": len(used),
        # with --keep-release, the figures of the run that trained the kept weights
        "train_seconds": old_summary["train_seconds"] if kept is not None else round(train_s),
        "threads": old_summary["threads"] if kept is not None else args.threads,
    }
    (exp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for p in exp.rglob("*"):
        p.chmod(0o644)
    log(f"summary: {json.dumps(summary)}")
    if lora_dp < 0.05 and not args.smoke:
        raise AssertionError(f"the LoRA hardly moves the answers (max |dp| {lora_dp})")
    if acc < 2 * chance and not args.smoke:
        raise AssertionError(f"test accuracy {acc:.3f} is not far above chance {chance:.3f}")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
