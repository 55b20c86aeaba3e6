"""The Ray Data example on a local 2-CPU Ray cluster (loopback only), 2 actors, ≥ 200 documents: every
response equals the line `kev decide --jsonl` writes for the same request, byte for byte."""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from pathlib import Path

import pytest

from conftest import BASE, KEV, ROOT, VALID, cli_jsonl

ray = pytest.importorskip("ray", reason="skipped: ray is not installed (pip install 'ray[data]')")

EXAMPLES = ROOT / "python" / "examples"
sys.path.insert(0, str(EXAMPLES))
import ray_decide  # noqa: E402

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages", "Sales": None},
    },
    "anger": {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["Calm", "Frustrated", "Very angry"],
    },
}
DOCUMENTS = 240
REFUSED = 7


def documents():
    """Texts from the fixture states, each made distinct; one is over the state token limit, so its line is
    the refusal the server would send."""
    states = []
    for p in VALID:
        s = json.loads(p.read_bytes()).get("state")
        if isinstance(s, str) and s:
            states.append(s)
    docs = [{"id": i, "text": f"{states[i % len(states)]} (document {i})"} for i in range(DOCUMENTS)]
    docs[REFUSED]["text"] = "word " * 70_000
    return docs


def test_ray_pipeline_equals_the_cli(ray_cluster, tmp_path, capsys):
    docs = documents()
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    out = tmp_path / "responses"

    t0 = time.perf_counter()
    ray_decide.run(
        model_args={"base": str(BASE), "kev": str(KEV)},
        questions=QUESTIONS,
        input_path=str(src),
        out_dir=str(out),
        actors=2,
        cpus_per_actor=1,
        batch_size=16,
    )
    ray_s = time.perf_counter() - t0

    rows = []
    for f in sorted(glob.glob(str(out / "*.json*"))):
        with open(f, encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    by_id = {r["id"]: r["response"] for r in rows}
    assert len(rows) == len(by_id) == DOCUMENTS

    # The same requests, as the pipeline builds them, through the CLI.
    lines = [json.dumps(ray_decide.request_for(d["text"], QUESTIONS), ensure_ascii=False) for d in docs]
    t0 = time.perf_counter()
    cli = cli_jsonl(lines, tmp_path / "cli")
    cli_s = time.perf_counter() - t0
    assert len(cli) == DOCUMENTS
    for d, line in zip(docs, cli):
        assert by_id[d["id"]] == line, d["id"]
        assert ("answers" in json.loads(line)) == (d["id"] != REFUSED), line[:200]

    # The engine's own time for the same requests, warm, in one process (no start-up, no load).
    import kev

    m = kev.Model(base=BASE, kev=KEV, cache_bytes=0)
    t0 = time.perf_counter()
    assert m.decide_jsonl(lines) == cli
    warm_s = time.perf_counter() - t0

    with capsys.disabled():
        print(
            f"\nthroughput, {DOCUMENTS} requests: ray_decide 2 actors x 1 CPU {ray_s:.1f} s ({DOCUMENTS / ray_s:.1f} req/s, "
            f"incl. actor start-up and 2 model loads); kev decide --jsonl {cli_s:.1f} s ({DOCUMENTS / cli_s:.1f} req/s, "
            f"incl. process start and 1 model load); warm kev.Model.decide_jsonl {warm_s:.1f} s "
            f"({DOCUMENTS / warm_s:.1f} req/s)"
        )
