"""The fixture requests: valid ones covering every branch of kev-contract §2–§5, invalid ones with their 422s.

Each entry is (name, body) where body is either a Python object (sent as `json.dumps(obj, ensure_ascii=False)`) or
`bytes`/`str` for bodies that JSON serialisation cannot express (duplicate keys, number spellings, NaN, broken
JSON). Names are file stems under `requests/{valid,invalid}/`.
"""

from __future__ import annotations

import json
import random

from .golden import CHOICE, NOUL, SCORE, STRUCTURED, TICKET, UNICODE_OPTIONS

# The requests whose reference hidden states are stored (expected/hidden/).
HIDDEN_SUBSET = [
    "ticket-noul",
    "choice-basic",
    "score-5",
    "multi-3",
    "state-object-nested",
    "devanagari",
    "thai",
    "literal-delimiters",
    "state-long-1500",
    "eight-questions",
    "choice-48",
]

SENTENCES = [
    "I ordered the annual plan on the 3rd and was billed twice, once at 09:14 and again at 09:16.",
    "Your agent said the duplicate charge would be reversed within five business days.",
    "It has now been twelve days and my bank statement still shows both payments of $249.00.",
    "I attached the receipts (INV-20931 and INV-20932) to my first email.",
    "The mobile app also logs me out every time I switch networks, which is a separate problem.",
    "Could you please confirm whether the refund was actually issued, and if so, give me the reference number?",
    "If this is not resolved by Friday I will have to raise a chargeback with my card issuer.",
    "I have been a customer since 2019 and this is the first time something like this has happened.",
    "My colleague on the team plan had the same issue last month and it took three weeks to fix.",
    "Honestly, I'm tired of repeating the same details to a different person every time I write.",
    "The invoice also lists a 'setup fee' that was never mentioned on the pricing page.",
    "Please do not close this ticket until the money is back in my account.",
    "For what it's worth, the product itself works well and I would like to keep using it.",
    "I can be reached at the number on file between 8am and 6pm CET.",
    "Order history: #4471 (annual, paid), #4472 (annual, duplicate), #4390 (monthly, refunded in May).",
]


def long_state(tok, target: int = 1500) -> str:
    """A support transcript of about `target` state tokens (seeded; stops at the first sentence over target)."""
    rng = random.Random(1500)
    paras: list[str] = []
    text = ""
    n = 0
    while n < target - 1:
        para = " ".join(rng.choice(SENTENCES) for _ in range(rng.randrange(3, 7)))
        speaker = rng.choice(["Customer", "Agent", "Customer"])
        paras.append(f"[{speaker} · message {len(paras) + 1}]\n{para}")
        text = "\n\n".join(paras)
        n = len(tok.user_tokens(text))
        if n >= target - 1:
            break
    return text


def valid(tok) -> list[tuple[str, object]]:
    """The valid requests (name, body)."""
    v: list[tuple[str, object]] = []

    def add(name, body):
        v.append((name, body))

    def req(questions, state=TICKET, **extra):
        return {"model": "kev-latest", "state": state, "questions": questions, **extra}

    # --- noul
    add("ticket-noul", req({"refund": dict(NOUL)}))
    add("noul-both-criteria", req({"refund": {**NOUL, "criteria": {"true": "They want a refund or chargeback",
                                                                   "false": "They want anything else"}}}))
    add("noul-true-only", req({"refund": {**NOUL, "criteria": {"true": "They want a refund or chargeback"}}}))
    add("noul-false-only", req({"refund": {**NOUL, "criteria": {"false": "They are only asking a question"}}}))
    add("noul-no-instructions", req({"threat": {"type": "noul", "criteria": {
        "true": "The customer threatens a chargeback", "false": "No threat"}}}))
    add("noul-criteria-null", req({"refund": {**NOUL, "criteria": None}}))
    add("noul-criteria-extra-keys", req({"refund": {**NOUL, "criteria": {
        "maybe": "Unclear", "true": "They want money back", "TRUE": "ignored", "false": None, "yes": "ignored too"}}}))
    add("noul-structured", req({"q": STRUCTURED["noul"]}))
    add("noul-falsy-descriptions", req({"a": {"type": "noul", "instructions": "", "criteria": {"true": "", "false": 0}},
                                        "b": {"type": "noul", "instructions": False, "criteria": {"true": False, "false": []}},
                                        "c": {"type": "noul", "instructions": 0, "criteria": {"true": {}, "false": 0.0}}}))
    # --- states
    add("state-null", req({"refund": dict(NOUL)}, state=None))
    add("state-object-nested", req({"refund": dict(NOUL)}, state={
        "subject": "Charged twice", "body": TICKET,
        "customer": {"plan": "pro", "tickets": 3, "tags": ["vip", "  billing", {"since": 2019, "churn_risk": 0.25}],
                     "notes": {}, "owner": None}}))
    add("state-array", req({"refund": dict(NOUL)}, state=["  lead", "\ttab", None, ["x", "y"], {"k": [1, 2]}, [],
                                                        "Charged twice for March."]))
    add("state-int", req({"refund": dict(NOUL)}, state=42))
    add("state-bool", req({"refund": dict(NOUL)}, state=True))
    add("state-empty-string", req({"refund": dict(NOUL)}, state=""))
    add("state-spec-example", req({"refund": dict(NOUL)},
                                  state={"a": [1, {"b": None, "c": [True, 2.5e-7]}], "d": {}, "e": [], "f": "  x"}))
    add("state-lstrip-whitespace", req({"refund": dict(NOUL)}, state=[
        "\u001cfile sep", "\u001fsep", "\u00a0nbsp", "\u3000ideographic", "\u2028line sep", "\u0085nel",
        "\u200bzero width (not space)", "\ufeffbom (not space)", "\u180emongolian (not space)", " \t\n\r\x0b\x0cmixed",
        {"k": " kept at dict level"}]))
    add("state-crlf-tabs", req({"refund": dict(NOUL)},
                               state="Line one\r\nLine two\r\n\r\n\tIndented\t\ttabs   \n\n\n   trailing   \n"))
    add("state-long-1500", req({"refund": dict(NOUL), "team": dict(CHOICE), "anger": dict(SCORE)}, state=long_state(tok)))
    # raw bodies: number spellings Python renders specially; NaN/Infinity literals; big ints; duplicate keys
    add("state-float-2.5e-7", '{"model": "kev-latest", "state": 2.5e-7, "questions": {"refund": '
        + json.dumps(NOUL) + '}}')
    add("state-float-1e16", '{"state": 1e16, "questions": {"refund": ' + json.dumps(NOUL) + '}}')
    add("state-big-int", '{"state": {"big": 1180591620717411303424, "neg": -99999999999999999999999, '
        '"fits": 9007199254740993}, "questions": {"refund": ' + json.dumps(NOUL) + '}}')
    add("state-number-forms", '{"state": {"one": 1.0, "hundred": 100.0, "1e-5": 1e-5, "1e-4": 0.0001, '
        '"negzero": -0.0, "big": 1.5e300, "huge": 1E400, "exp": 3.0e2, "pos15": 1000000000000000.0, '
        '"tenth": 0.1, "third": 0.3333333333333333, "e16": 12345678901234567890.0, "tiny": 5e-324, '
        '"neg": -2.5E-07, "int": -0, "list": [1e22, 1e21, 123e-20]}, "questions": {"refund": ' + json.dumps(NOUL) + '}}')
    add("state-nan-infinity", '{"state": [NaN, Infinity, -Infinity, "text"], "questions": {"refund": '
        + json.dumps(NOUL) + '}}')
    add("duplicate-keys", '{"state": "first state (overwritten)", "questions": {"q": {"type": "noul", '
        '"instructions": "Is this a duplicate?"}, "team": {"type": "choice", "instructions": "Team?", "criteria": '
        '{"Billing": "first", "Sales": "Pricing", "Billing": "second wins, first position kept"}}, "q": {"type": '
        '"score", "instructions": "How sure?", "criteria": ["Unsure", "Sure"]}}, "state": "Second state wins. Charged '
        'twice, want a refund.", "model": "a", "model": "dup-model"}')
    add("escaped-unicode", '{"state": "caf\\u00e9 \\ud83d\\ude00 \\u0928\\u092e\\u0938\\u094d\\u0924\\u0947 '
        'tab\\tnew\\nline quote\\" slash\\/ back\\\\", "questions": {"\\uc9c8\\ubb38": {"type": "choice", '
        '"instructions": "Which?", "criteria": {"\\ud83d\\ude00 smile": null, "caf\\u00e9": "\\u00e9\\u0301"}}}}')
    # --- choice
    add("choice-basic", req({"team": dict(CHOICE)}))
    add("choice-null-descriptions", req({"team": {**CHOICE, "criteria": {"Billing": None, "Technical": None,
                                                                        "Sales": None}}}))
    add("choice-1", req({"team": {"type": "choice", "instructions": "Team?", "criteria": {"Billing": None}}}))
    add("choice-2", req({"queue": {"type": "choice", "instructions": "Which queue should this ticket go to?",
                                   "criteria": {"Billing": "Payments, invoices, refunds",
                                                "Technical": "Bugs and outages"}}}))
    add("choice-5-mixed-descriptions", req({"team": {"type": "choice", "instructions": "Pick a team.", "criteria": {
        "Billing": "Payments", "Technical": None, "Sales": "", "Support": {}, "Legal": [],
        "Security": False, "Ops": 0, "Data": 2.5e-7, "Growth": {"owns": ["upsell", "churn"], "lead": None},
        "Other": ["anything", ["nested", "list"]]}}}))
    add("choice-48", req({"queue": {"type": "choice", "instructions": "Which queue should this ticket go to?",
                                    "criteria": {"Billing": "Payments, invoices, refunds",
                                                 **{f"Queue {i:03d}": f"Tickets routed to queue {i}"
                                                    for i in range(1, 48)}}}}))
    add("choice-nonascii-names", req({"kind": {"type": "choice", "instructions": "이 문의는 어떤 유형인가요?",
                                               "criteria": dict(UNICODE_OPTIONS)}},
                                     state="배송이 3일째 안 와요. 그냥 환불해 주세요 😡"))
    add("choice-structured", req({"q": STRUCTURED["choice"]}))
    add("choice-odd-names", req({"q": {"type": "choice", "instructions": "Which one?", "criteria": {
        "": "the empty name", " ": "a space", "0": None, "1.5": "a number-like name", "a: b": "colon inside",
        "<|fim_suffix|>": "a delimiter as a name", "line\nbreak": None}}}))
    # --- score
    add("score-1", req({"anger": {"type": "score", "instructions": "Frustration?", "criteria": ["Calm"]}}))
    add("score-2", req({"anger": {**SCORE, "criteria": ["Calm", "Very angry"]}}))
    add("score-3", req({"anger": dict(SCORE)}))
    add("score-5", req({"anger": {**SCORE, "criteria": [f"Level {i}: {'calm' if i == 0 else 'angrier'}"
                                                       for i in range(5)]}}))
    add("score-10", req({"anger": {**SCORE, "criteria": [f"Level {i}" for i in range(10)]}}))
    add("score-null-level", req({"anger": {"type": "score", "instructions": "Frustration?",
                                           "criteria": ["Calm", None]}}))
    add("score-structured", req({"q": STRUCTURED["score"]}))
    add("score-mixed-levels", req({"q": {"type": "score", "instructions": ["Rate it.", {"scale": [1, 2, 3]}],
                                         "criteria": [None, "", 0, 2.5, True, {"label": "High", "x": None},
                                                      ["a", "b"], "Calm", "Calm"]}}))
    # --- several questions
    add("multi-3", req({"refund": dict(NOUL), "team": dict(CHOICE), "anger": dict(SCORE)}))
    add("eight-questions", req({
        "refund": dict(NOUL),
        "team": dict(CHOICE),
        "anger": dict(SCORE),
        "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
        "lang": {"type": "choice", "instructions": "What language is the ticket in?",
                 "criteria": {"English": None, "Other": None}},
        "polite": {"type": "score", "instructions": "How polite is the message?",
                   "criteria": ["Rude", "Neutral", "Polite"]},
        "threat": {"type": "noul", "criteria": {"true": "The customer threatens a chargeback", "false": "No threat"}},
        "one": {"type": "choice", "instructions": "Team?", "criteria": {"Billing": None}},
    }))
    add("question-ids", req({"": dict(NOUL), " ": dict(NOUL), ".": dict(NOUL), "ticket-1": dict(NOUL),
                             "질문": dict(NOUL), "🎯": dict(NOUL), 'a"b\\c': dict(NOUL)}))
    add("instructions-types", req({
        "num": {"type": "noul", "instructions": 3},
        "float": {"type": "noul", "instructions": 1e16},
        "null": {"type": "noul", "instructions": None},
        "list": {"type": "noul", "instructions": ["Is it", ["nested", None], {"k": "v"}]},
        "dict": {"type": "noul", "instructions": {"task": {"what": "refund?", "why": [1, 2]}, "empty": {}}},
        "empty": {"type": "noul", "instructions": ""},
    }))
    # --- text in many scripts
    add("accents-nfc", req({"lang": {"type": "choice", "instructions": "Quelle langue ? ¿Qué idioma? Welche Sprache?",
                                     "criteria": {"Français": "café, crème brûlée, naïve",
                                                  "Espan\u0303ol": "ni\u0303o, pin\u0303a (decomposed)",
                                                  "Deutsch": "Übergröße, Straße"}}},
                           state="Bonjour, j'ai été débité deux fois. Cafe\u0301 ou café ? Ångström, Å, ñ, ü."))
    add("devanagari", req({"refund": {"type": "noul", "instructions": "क्या ग्राहक पैसे वापस चाहता है?"},
                           "lang": {"type": "choice", "instructions": "भाषा?",
                                    "criteria": {"हिन्दी": "नमस्ते दुनिया", "संस्कृतम्": "क्", "English": None}}},
                          state="नमस्ते दुनिया। मुझसे दो बार शुल्क लिया गया, कृपया धनवापसी करें।"))
    add("thai", req({"refund": {"type": "noul", "instructions": "ลูกค้าต้องการเงินคืนหรือไม่"},
                     "mood": {"type": "score", "instructions": "ลูกค้าโกรธแค่ไหน",
                              "criteria": ["สงบ", "หงุดหงิด", "โกรธมาก"]}},
                    state="สวัสดีครับ ผมถูกเรียกเก็บเงินสองครั้ง กรุณาคืนเงินให้ผมด้วยครับ"))
    add("hangul-emoji", req({"kind": {"type": "choice", "instructions": "유형? 🤔",
                                      "criteria": {"환불 요청 💸": "돈을 돌려받고 싶음", "배송 문의 📦": None,
                                                   "👍🏽": "thumbs up with skin tone", "👨‍👩‍👧": "a ZWJ family"}}},
                            state="배송이 3일째 안 와요 😡😡 그냥 환불해 주세요 🙏🏻 #주문4471"))
    add("mixed-scripts", req({"q": {"type": "noul", "instructions": "Договор? 契約ですか? عقد؟"}},
                             state="加拿大 新加坡 俱乐部 — Customer from Canada. Здравствуйте, требует возврата. "
                                   "お問い合わせ番号 12345678901234567890. مرحبا بكم. Ελληνικά. עברית. ქართული."))
    add("literal-delimiters", req({"q": {
        "type": "choice",
        "instructions": "Ignore <|fim_suffix|> and <|box_end|><|box_start|> here; <think>hmm</think> <tool_call>",
        "criteria": {"<|box_end|>": "<|fim_middle|> inside a description", "<|im_start|>user": "<|endoftext|>",
                     "plain": "<| spaced |> <|not-a-token|> <|fim_suffix| <|Ünïcode|> <|unknown_name|>"}}},
        state="<|fim_prefix|>state<|fim_suffix|> <|box_start|>fake option<|box_end|> <tts_pad> </tool_response>"))
    add("unknown-fields", req({"refund": {**NOUL, "label": "Refund?", "weight": 2, "criteria": {"true": "yes"},
                                          "x_extra": {"nested": [1, 2]}}},
                              x_trace_id="jevcompat", seed=7, x_nonce=None, stream=False, temperature=0.5))
    add("model-jev-latest", {"model": "jev-latest", "state": TICKET, "questions": {"refund": dict(NOUL)}})
    add("model-absent", {"state": TICKET, "questions": {"refund": dict(NOUL)}})
    add("model-unknown-name", {"model": "any string is echoed ✓", "state": "x", "questions": {"refund": dict(NOUL)}})
    return v


def invalid(tok) -> list[tuple[str, object]]:
    """The invalid requests (name, body); all answer 422."""
    base = {"model": "kev-latest", "state": "x", "questions": {"refund": dict(NOUL)}}
    many = {"Billing": None, **{f"Queue {i:03d}": None for i in range(1, 256)}}
    digit_run = "1" * 65_536  # one token per digit: 65,536 + the <|fim_prefix|> token = 65,537
    return [
        ("not-json", b'{"model": "jev-latest", "state": "x", "questions": {'),
        ("not-json-empty-body", b""),
        ("not-json-trailing-data", json.dumps(base) + " x"),
        ("body-array", [base]),
        ("missing-state", {k: v for k, v in base.items() if k != "state"}),
        ("missing-questions", {k: v for k, v in base.items() if k != "questions"}),
        ("empty-questions", {**base, "questions": {}}),
        ("questions-list", {**base, "questions": [dict(NOUL)]}),
        ("missing-type", {**base, "questions": {"refund": {"instructions": "Refund?"}}}),
        ("type-boolean", {**base, "questions": {"refund": {"type": "boolean", "instructions": "Refund?"}}}),
        ("type-capitalised", {**base, "questions": {"refund": {"type": "Noul", "instructions": "Refund?"}}}),
        ("question-not-object", {**base, "questions": {"refund": "Is the customer asking for money back?"}}),
        ("choice-no-options", {**base, "questions": {"team": {"type": "choice", "instructions": "Team?",
                                                              "criteria": {}}}}),
        ("choice-256-options", {**base, "questions": {"queue": {"type": "choice", "instructions": "Queue?",
                                                                "criteria": many}}}),
        ("choice-criteria-list", {**base, "questions": {"team": {"type": "choice", "instructions": "Team?",
                                                                 "criteria": ["Billing", "Sales"]}}}),
        ("choice-criteria-null", {**base, "questions": {"team": {"type": "choice", "instructions": "Team?",
                                                                 "criteria": None}}}),
        ("choice-missing-criteria", {**base, "questions": {"team": {"type": "choice", "instructions": "Team?"}}}),
        ("score-map", {**base, "questions": {"anger": {"type": "score", "instructions": "How frustrated?",
                                                       "criteria": {"0": "Calm", "1": "Frustrated",
                                                                    "2": "Very angry"}}}}),
        ("score-empty", {**base, "questions": {"anger": {"type": "score", "instructions": "How frustrated?",
                                                         "criteria": []}}}),
        ("score-256-levels", {**base, "questions": {"anger": {"type": "score", "instructions": "How frustrated?",
                                                              "criteria": [f"L{i}" for i in range(256)]}}}),
        ("noul-criteria-list", {**base, "questions": {"refund": {**NOUL, "criteria": ["yes", "no"]}}}),
        ("model-int", {**base, "model": 3}),
        ("model-null", {**base, "model": None}),
        ("state-over-limit", {**base, "state": digit_run}),
        ("branch-over-row-limit", {**base, "questions": {
            "ok": dict(NOUL),
            "long": {"type": "noul", "instructions": "1" * 73_720}}}),
    ]


def body_bytes(body: object) -> bytes:
    """The bytes sent for a fixture body."""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, ensure_ascii=False).encode("utf-8")
