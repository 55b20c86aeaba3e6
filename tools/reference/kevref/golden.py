"""The 31 golden vectors of kev-contract §12 (jevcompat 0.1.1's recorded Kev-0.8B exchanges).

Requests are rebuilt from jevcompat 0.1.1's own case definitions (`jevcompat/checks.py`: TICKET, NOUL, CHOICE,
SCORE and the per-case payloads); `model` is jevcompat's default `jev-latest` (it does not change any count).
Answers are the recorded ones (model outputs of Kev-0.8B pre-1.0), kept only to test answer shaping and
`output_tokens`; `input_tokens` must reproduce exactly through the reference rendering with either tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import contract as C

TICKET = ("Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised "
          "last week still hasn't arrived. I've emailed three times. Please fix this today or I will "
          "dispute the charge with my bank.")
NOUL = {"type": "noul", "instructions": "Is the customer asking for money back?"}
CHOICE = {"type": "choice", "instructions": "Which team should handle this ticket?",
          "criteria": {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages, integrations",
                       "Sales": "Pricing questions, upgrades, new contracts"}}
SCORE = {"type": "score", "instructions": "How frustrated is the customer?",
         "criteria": ["Calm", "Frustrated", "Very angry"]}
MODEL = "jev-latest"


def _req(questions: dict, state=TICKET) -> dict:
    return {"model": MODEL, "state": state, "questions": questions}


def _queue(n: int) -> dict:
    options = {"Billing": "Payments, invoices, refunds", "Technical": "Bugs and outages"} if n == 2 else \
        {"Billing": "Payments, invoices, refunds", **{f"Queue {i:03d}": f"Tickets routed to queue {i}" for i in range(1, n)}}
    return {"queue": {"type": "choice", "instructions": "Which queue should this ticket go to?", "criteria": options}}


def _score(n: int) -> dict:
    levels = ["Calm", "Very angry"] if n == 2 else SCORE["criteria"] if n == 3 else \
        [f"Level {i}: {'calm' if i == 0 else 'angrier'}" for i in range(n)]
    return {"anger": {"type": "score", "instructions": "How frustrated is the customer?", "criteria": levels}}


def _choice(p: dict, conf: float) -> dict:
    best = max(p, key=p.__getitem__)
    return {"type": "choice", "choice": best, "confidence": conf, "probabilities": p}


def _sc(score: float, legend: list, p: list, conf: float) -> dict:
    return {"type": "score", "score": score, "legend": {str(i): v for i, v in enumerate(legend)},
            "probabilities": {str(i): v for i, v in enumerate(p)}, "confidence": conf}


TEAM = {"Billing": 0.9671, "Technical": 0.0142, "Sales": 0.0187}
MULTI_ANSWERS = [
    {"type": "noul", "noul": 0.9502},
    _choice({"Billing": 0.9675, "Technical": 0.0138, "Sales": 0.0187}, 0.9512),
    _sc(1.4413, SCORE["criteria"], [0.026, 0.5066, 0.4673], 0.7533),
]
STRUCTURED = {
    "noul": {"type": "noul", "instructions": {"task": "Decide whether the customer wants money back", "include": ["refunds", "chargebacks"]},
             "criteria": {"true": {"examples": ["refund me", "I'll dispute this"]}, "false": ["questions", "complaints without a request"]}},
    "choice": {"type": "choice", "instructions": ["Route the ticket.", "Pick exactly one team."],
               "criteria": {"Billing": {"owns": ["invoices", "refunds"]}, "Technical": ["bugs", "outages"], "Sales": "Pricing"}},
    "score": {"type": "score", "instructions": {"scale": "frustration"},
              "criteria": [{"label": "Calm"}, {"label": "Frustrated"}, {"label": "Very angry", "signals": ["threats"]}]},
}
UNICODE_OPTIONS = {"환불 요청": "고객이 돈을 돌려받기를 원함", "배송 문의": "배송 상태를 물음", "🙂 기타": "그 외"}


def cases() -> list[dict]:
    """`{"name", "request", "input_tokens", "answers"?, "output_tokens"?}` in the order of the §12 table."""
    g: list[dict] = []

    def add(name, request, n, answers=None, out=None):
        d = {"name": name, "request": request, "input_tokens": n}
        if answers is not None:
            d["answers"] = answers
            d["output_tokens"] = out
        g.append(d)

    add("noul", _req({"refund": dict(NOUL)}), 68, {"refund": {"type": "noul", "noul": 0.9523}}, 22)
    add("noul-both-criteria", _req({"refund": {**NOUL, "criteria": {"true": "They want a refund or chargeback", "false": "They want anything else"}}}), 81)
    add("noul-true-only", _req({"refund": {**NOUL, "criteria": {"true": "They want a refund or chargeback"}}}), 76)
    add("noul-false-only", _req({"refund": {**NOUL, "criteria": {"false": "They are only asking a question"}}}), 75)
    add("noul-no-instructions", _req({"threat": {"type": "noul", "criteria": {"true": "The customer threatens a chargeback", "false": "No threat"}}}), 70)
    add("state-null", _req({"refund": dict(NOUL)}, state=None), 17, {"refund": {"type": "noul", "noul": 0.3139}}, 22)
    add("state-object", _req({"refund": dict(NOUL)}, state={"subject": "Charged twice", "body": TICKET, "customer": {"plan": "pro", "tickets": 3}}), 90)
    add("state-array", _req({"refund": dict(NOUL)}, state=["Charged twice for March.", "Refund promised last week, not received.", "Will dispute the charge."]), 42)
    add("choice", _req({"team": dict(CHOICE)}), 92, {"team": _choice(dict(TEAM), 0.9507)}, 63)
    add("choice-null-descriptions", _req({"team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                                                   "criteria": {"Billing": None, "Technical": None, "Sales": None}}}), 70)
    add("choice-2", _req(_queue(2)), 79, {"queue": _choice({"Billing": 0.9842, "Technical": 0.0158}, 0.9683)}, 52)
    add("choice-26", _req(_queue(26)), 437)
    add("choice-128", _req(_queue(128)), 1995)
    add("choice-1", _req({"team": {"type": "choice", "instructions": "Team?", "criteria": {"Billing": None}}}), 59,
        {"team": _choice({"Billing": 1.0}, 1.0)}, 35)
    add("score-2", _req(_score(2)), 68, {"anger": _sc(0.932, ["Calm", "Very angry"], [0.068, 0.932], 0.932)}, 70)
    add("score-3", _req(_score(3)), 74, {"anger": _sc(1.4394, SCORE["criteria"], [0.0269, 0.5069, 0.4662], 0.7535)}, 94)
    add("score-5", _req(_score(5)), 99)
    add("score-10", _req(_score(10)), 139)
    add("score-1", _req({"anger": {"type": "score", "instructions": "Frustration?", "criteria": ["Calm"]}}), 62,
        {"anger": _sc(0.0, ["Calm"], [1.0], 1.0)}, 47)
    add("score-11", _req({"anger": {"type": "score", "instructions": "Frustration?", "criteria": [f"Level {i}" for i in range(11)]}}), 114)
    add("score-null-level", _req({"anger": {"type": "score", "instructions": "Frustration?", "criteria": ["Calm", None]}}), 64,
        {"anger": _sc(0.6852, ["Calm", ""], [0.3148, 0.6852], 0.6852)}, 72)
    add("structured-noul", _req({"q": STRUCTURED["noul"]}), 105)
    add("structured-choice", _req({"q": STRUCTURED["choice"]}), 95)
    add("structured-score", _req({"q": STRUCTURED["score"]}), 83,
        {"q": _sc(1.1403, ["label: Calm", "label: Frustrated", "label: Very angry\nsignals:\n  - threats"],
                  [0.0715, 0.7166, 0.2119], 0.8583)}, 106)
    add("multi", _req({"refund": dict(NOUL), "team": dict(CHOICE), "anger": dict(SCORE)}), 130,
        dict(zip(["refund", "team", "anger"], MULTI_ANSWERS)), 178)
    renamed = ["zz-renamed.1", "Q 🙂", "x_y_z"]
    add("multi-renamed", _req(dict(zip(renamed, [dict(NOUL), dict(CHOICE), dict(SCORE)]))), 130,
        dict(zip(renamed, MULTI_ANSWERS)), 193)
    add("unicode", _req({"kind": {"type": "choice", "instructions": "이 문의는 어떤 유형인가요?", "criteria": dict(UNICODE_OPTIONS)}},
                        state="배송이 3일째 안 와요. 그냥 환불해 주세요 😡"), 55,
        {"kind": _choice({"환불 요청": 0.3657, "배송 문의": 0.4089, "🙂 기타": 0.2253}, 0.1134)}, 126)
    for qid, out in (("with space", 23), ("질문", 30), ("🎯", 29)):
        add(f"question-id-{qid}", _req({qid: dict(NOUL)}), 68, {qid: {"type": "noul", "noul": 0.9523}}, out)
    add("ambiguous", _req({"team": {"type": "choice", "instructions": "Which of these colours is the writer's favourite?",
                                    "criteria": {"Red": None, "Green": None, "Blue": None, "Yellow": None, "Purple": None}},
                           "mood": {"type": "score", "instructions": "How much does the writer enjoy jazz?",
                                    "criteria": ["Not at all", "A little", "Somewhat", "A lot", "More than anything"]}}, state="Hello."), 62,
        {"team": _choice({"Red": 0.2228, "Green": 0.2075, "Blue": 0.2142, "Yellow": 0.1714, "Purple": 0.1841}, 0.0285),
         "mood": _sc(1.9077, ["Not at all", "A little", "Somewhat", "A lot", "More than anything"],
                     [0.1293, 0.269, 0.3172, 0.1337, 0.1508], 0.7593)}, 215)
    if len(g) != 31:
        raise AssertionError(f"expected 31 golden vectors, have {len(g)}")
    return g


def check(tokenizer_files: dict[str, Path]) -> list[dict]:
    """Assert all 31 `input_tokens` (and the recorded `output_tokens`) with every given tokenizer file."""
    g = cases()
    failures = []
    for variant, path in tokenizer_files.items():
        tok = C.KevTokenizer(path)
        for case in g:
            n = C.compile_request(case["request"], tok).input_tokens
            if n != case["input_tokens"]:
                failures.append(f"{variant} {case['name']}: input_tokens {n} != {case['input_tokens']}")
            if "answers" in case:
                m = C.output_tokens(case["answers"], tok)
                if m != case["output_tokens"]:
                    failures.append(f"{variant} {case['name']}: output_tokens {m} != {case['output_tokens']}")
    if failures:
        raise AssertionError("golden vectors failed:\n" + "\n".join(failures))
    return g


def write(path: Path, tokenizer_files: dict[str, Path]) -> int:
    g = check(tokenizer_files)
    path.write_text(json.dumps(g, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return len(g)
