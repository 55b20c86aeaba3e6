"""Per-request expected data in the `expected/valid/*.json` / `expected/invalid/*.json` shapes (fixtures/README.md),
shared by `generate.py` and the `reference_arm.py` CLI."""

from __future__ import annotations

import json
from pathlib import Path

from . import arms as A
from . import contract as C
from . import validation as V


def classify(bodies: list[tuple[str, bytes]], tokenizer_json: Path) -> tuple[list, list]:
    """Split raw bodies into ([(name, parsed request, Compiled)], [(name, status, body)]) through Kev's FastAPI
    schema and the token limits; a valid request must compile identically from the raw JSON."""
    app = V.make_app(tokenizer_json)
    tok = C.KevTokenizer(tokenizer_json)
    ok, bad = [], []
    for name, raw in bodies:
        status, body = V.call(app, raw)
        if status == 200:
            req = json.loads(raw)
            c = C.compile_request(req, tok)
            if c.input_tokens != body["input_tokens"]:
                raise AssertionError(f"{name}: schema path and raw path disagree")
            ok.append((name, req, c))
        else:
            bad.append((name, status, body))
    return ok, bad


def valid_records(base_dir: Path, kev_dir: Path, ok: list, arms=A.ARMS, hidden_names: set[str] | frozenset = frozenset(),
                  request_path=lambda name: f"requests/valid/{name}.json", hidden_path=lambda name: f"expected/hidden/{name}.safetensors",
                  log=None) -> tuple[list[dict], dict[str, dict]]:
    """(records in the expected/valid shape, {name: {"0": tensor, ...}} hidden states) for compiled requests."""
    tok = C.KevTokenizer(kev_dir / "tokenizer.json")
    compiled = [c for _, _, c in ok]
    hidden_for = {i for i, (name, _, _) in enumerate(ok) if name in hidden_names}
    results = A.run_arms(base_dir, kev_dir, compiled, arms, hidden_for, log)
    records, hidden = [], {}
    for (name, _req, c), res in zip(ok, results):
        qs = []
        for k, q in enumerate(c.questions):
            d = {
                "id": q.qid,
                "type": q.type,
                "row_ids": q.row_ids,
                "option_ends": q.option_ends,
                "decide": q.decide,
                "option_texts": q.option_texts,
                "keys": q.keys,
            }
            for arm in A.ARMS:
                d[arm] = res[arm][k] if arm in res else None
            qs.append(d)
        rec = {
            "request": request_path(name),
            "state_ids": c.state_ids,
            "input_tokens": c.input_tokens,
            "hidden": hidden_path(name) if res["hidden"] else None,
            "questions": qs,
        }
        if "reference" in res:
            rec["response"] = C.response_of(c, res["reference"], tok)
        if "merged_bf16" in res:
            rec["response_merged_bf16"] = C.response_of(c, res["merged_bf16"], tok)
        if res["hidden"]:
            hidden[name] = {str(k): t for k, t in enumerate(res["hidden"])}
        records.append(rec)
    return records, hidden


def dumps(obj) -> str:
    """The fixture JSON style: one line, UTF-8, Python's default separators, floats as `repr`."""
    return json.dumps(obj, ensure_ascii=False) + "\n"
