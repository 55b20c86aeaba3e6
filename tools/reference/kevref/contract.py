"""Kev 1.0's request handling with Python semantics (kev-contract §3–§5, §7, §8.4), written as the spec's
pseudo-code reads: rendering, options, token rows, readout indices, limits, answers and usage.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE, QUESTION, OPEN, CLOSE, DECIDE = 248060, 248061, 248049, 248050, 248062
MAX_STATE = 65_536
MAX_ROW = 73_728
_PIPE_TOKEN = re.compile(r"<\|([A-Za-z0-9_]+)\|>")


# --------------------------------------------------------------------------------------------------- rendering §3

def render(v: Any, indent: int = 0) -> str:
    """kev-contract §3.1."""
    pad = "  " * indent
    if v is None:
        return ""
    if isinstance(v, (str, int, float, bool)):
        return str(v)
    if isinstance(v, list):
        return "\n".join(pad + "- " + render(item, indent + 1).lstrip() for item in v)
    if isinstance(v, dict):
        return "\n".join(
            pad + k + ":\n" + render(x, indent + 1) if isinstance(x, (dict, list)) else pad + k + ": " + render(x)
            for k, x in v.items()
        )
    raise TypeError(f"cannot render {type(v).__name__}")


def option_text(name: str, desc: Any) -> str:
    """kev-contract §3.2."""
    if desc is None or desc == "":
        return name
    return name + ": " + render(desc)


def options_of(q: dict) -> tuple[list[str], list[str]]:
    """(option texts, probability keys) of a validated question, in request order."""
    t = q["type"]
    if t == "noul":
        c = q.get("criteria") or {}
        return [option_text("no", c.get("false")), option_text("yes", c.get("true"))], ["false", "true"]
    if t == "choice":
        crit = q["criteria"]
        return [option_text(name, desc) for name, desc in crit.items()], list(crit)
    if t == "score":
        levels = q["criteria"]
        return [render(level) for level in levels], [str(i) for i in range(len(levels))]
    raise ValueError(f"unknown question type {t!r}")


# ----------------------------------------------------------------------------------------------- tokenization §4

class KevTokenizer:
    """The Kev-variant tokenizer through the `tokenizers` package (what transformers wraps)."""

    def __init__(self, tokenizer_json: Path):
        from tokenizers import Tokenizer

        self.tk = Tokenizer.from_file(str(tokenizer_json))

    def plain(self, text: str) -> list[int]:
        """Encode without the `<|…|>` rewrite (special tokens matched); `output_tokens` uses this."""
        if text == "":
            return []
        return self.tk.encode(text, add_special_tokens=False).ids

    def user_tokens(self, text: str) -> list[int]:
        """kev-contract §4.1: `<|name|>` → `<¦name¦>`, then encode."""
        return self.plain(_PIPE_TOKEN.sub("<¦\\1¦>", text))


# ------------------------------------------------------------------------------------------------------ rows §5

class TokenLimitError(Exception):
    """A 422 for a state or row over the limits (kev-contract §5.2), in the object form the task chose."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def body(self) -> dict:
        return {"detail": {"error_type": "invalid_request_error", "message": self.message}}


@dataclass
class QuestionRow:
    """One question's row and readout indices."""

    qid: str
    type: str
    option_texts: list[str]
    keys: list[str]
    branch: list[int]
    row_ids: list[int]
    option_ends: list[int]
    decide: int
    legend: dict[str, str] | None = None


@dataclass
class Compiled:
    """A compiled request: the state prefix once, one row per question, `input_tokens`."""

    model: str
    state_ids: list[int]
    questions: list[QuestionRow] = field(default_factory=list)
    input_tokens: int = 0


def compile_request(req: dict, tok: KevTokenizer) -> Compiled:
    """Rows per kev-contract §5.1 and limits per §5.2; `req` is already schema-valid."""
    state_ids = [STATE] + tok.user_tokens(render(req["state"]))
    ls = len(state_ids)
    if ls > MAX_STATE:
        raise TokenLimitError(
            f"state is {ls:,} tokens, over the 65,536-token limit (the <state> token included): shorten the document "
            "or split it across requests; or start the server with KEV_TRUNCATE_STATES=1 to read only its first "
            "65,536 tokens (responses then say truncated: true)"
        )
    out = Compiled(model=req.get("model", "kev-latest"), state_ids=state_ids)
    total = ls
    for qid, q in req["questions"].items():
        texts, keys = options_of(q)
        branch = [QUESTION] + tok.user_tokens(render(q.get("instructions")))
        ends = []
        for text in texts:
            branch += [OPEN] + tok.user_tokens(text) + [CLOSE]
            ends.append(ls + len(branch) - 1)
        branch.append(DECIDE)
        if ls + len(branch) > MAX_ROW:
            raise TokenLimitError(f"branch too long: {len(branch)} tokens with a {ls}-token state (row limit 73728)")
        row = state_ids + branch
        legend = {str(i): render(level) for i, level in enumerate(q["criteria"])} if q["type"] == "score" else None
        out.questions.append(QuestionRow(qid, q["type"], texts, keys, branch, row, ends, len(row) - 1, legend))
        total += len(branch)
    out.input_tokens = total
    return out


# --------------------------------------------------------------------------------------------------- answers §7

def py_sum(xs) -> float:
    """CPython 3.12 `sum()` over floats (Neumaier-compensated), so results do not depend on the interpreter."""
    f = 0.0
    c = 0.0
    for x in xs:
        x = float(x)
        t = f + x
        if abs(f) >= abs(x):
            c += (f - t) + x
        else:
            c += (x - t) + f
        f = t
    if c and math.isfinite(c):
        f += c
    return f


def _normalize(probs: list[float]) -> list[float]:
    total = py_sum(probs)
    if total == 0:
        return [1.0 / len(probs)] * len(probs)
    return [p / total for p in probs]


def choice_confidence(probs: list[float]) -> float:
    """TypeSafe's reference formula (system-one-adapter `confidence_metrics.py`)."""
    if len(probs) == 1:
        return 1.0
    n = _normalize(probs)
    u = 1.0 / len(n)
    return (max(n) - u) / (1.0 - u)


def score_confidence(probs: list[float]) -> float:
    """TypeSafe's reference formula (system-one-adapter `confidence_metrics.py`)."""
    if len(probs) == 1:
        return 1.0
    n = _normalize(probs)
    mode = max(range(len(n)), key=n.__getitem__)
    dist = py_sum(p * abs(i - mode) for i, p in enumerate(n))
    center = (len(n) - 1) / 2
    mad = py_sum(abs(i - center) for i in range(len(n))) / len(n)
    return max(0.0, 1.0 - dist / mad)


def round4(x: float) -> float:
    return round(x, 4)


def answer_of(q: QuestionRow, probs: list[float]) -> dict:
    """One answer object (key order as Kev emits it)."""
    if q.type == "noul":
        return {"type": "noul", "noul": round4(probs[1])}
    if q.type == "choice":
        best = max(range(len(probs)), key=probs.__getitem__)
        return {
            "type": "choice",
            "choice": q.keys[best],
            "confidence": round4(choice_confidence(probs)),
            "probabilities": {k: round4(p) for k, p in zip(q.keys, probs)},
        }
    if q.type == "score":
        return {
            "type": "score",
            "score": round4(py_sum(i * p for i, p in enumerate(probs))),
            "legend": dict(q.legend or {}),
            "probabilities": {k: round4(p) for k, p in zip(q.keys, probs)},
            "confidence": round4(score_confidence(probs)),
        }
    raise ValueError(q.type)


def output_tokens(answers: dict, tok: KevTokenizer) -> int:
    """kev-contract §8.4: tokens of default `json.dumps(answers)`, plain tokenizer."""
    return len(tok.plain(json.dumps(answers)))


def response_of(c: Compiled, probs: list[list[float]], tok: KevTokenizer) -> dict:
    """The response body (without Kev's `latency_ms`)."""
    answers = {q.qid: answer_of(q, p) for q, p in zip(c.questions, probs)}
    return {
        "model": c.model,
        "answers": answers,
        "usage": {"input_tokens": c.input_tokens, "output_tokens": output_tokens(answers, tok)},
    }
