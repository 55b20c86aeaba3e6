#!/usr/bin/env python3
"""Write the `kev accept` request set (fixtures/accept/requests/) and its synthetic reference output.

    PY crates/accept/tools/make_set.py   # from the repository root; PY = the tools/reference venv's python

1. Copies a chosen subset of the reference generator's valid requests (fixtures/requests/valid, bytes as they are)
   and writes the new ones below (seeded, deterministic): option counts up to 255, long states in several scripts.
2. Runs tools/reference/reference_arm.py (all three arms) on the synthetic release over the set and writes
   fixtures/accept/reference-synthetic.json, the reference output `cargo test -p kev-accept` gates against.

Two runs give byte-identical files. The set is embedded in the `kev` binary (crates/accept/build.rs).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools" / "reference"))

from kevref import contract as C  # noqa: E402
from kevref.golden import NOUL, TICKET  # noqa: E402

OUT = ROOT / "fixtures" / "accept"
REQ = OUT / "requests"

# Requests taken as they are from fixtures/requests/valid (the reference generator's): every question type,
# option counts 1..48, short and ~1,500-token states, Devanagari, Thai, Hangul + emoji, mixed scripts, delimiters.
COPIED = [
    "ticket-noul", "noul-both-criteria", "noul-structured", "choice-basic", "choice-1", "choice-48",
    "choice-5-mixed-descriptions", "choice-nonascii-names", "score-1", "score-5", "score-10", "score-mixed-levels",
    "multi-3", "eight-questions", "question-ids", "instructions-types", "state-object-nested", "state-number-forms",
    "state-long-1500", "devanagari", "thai", "hangul-emoji", "mixed-scripts", "literal-delimiters", "accents-nfc",
]

CJK_SENTENCES = [
    "我在本月三号订购了年度套餐，但被扣了两次款，一次在九点十四分，另一次在九点十六分。",
    "你们的客服说重复扣款会在五个工作日内退回。",
    "现在已经过去十二天了，我的银行账单上仍然显示两笔二百四十九美元的付款。",
    "我在第一封邮件里附上了收据（INV-20931 和 INV-20932）。",
    "另外，每次切换网络时手机应用都会把我登出，这是另一个问题。",
    "請確認退款是否已經發出，如果已經發出，請提供參考編號。",
    "如果星期五之前還沒有解決，我將不得不向發卡銀行申請退單。",
    "お問い合わせ番号は4471です。二重請求の返金をお願いします。",
    "製品自体はとても良いので、これからも使い続けたいと思っています。",
]
ARABIC_SENTENCES = [
    "طلبت الخطة السنوية في الثالث من الشهر وتم خصم المبلغ مرتين.",
    "قال موظف الدعم إن الخصم المكرر سيُعاد خلال خمسة أيام عمل.",
    "مرت الآن اثنا عشر يومًا وما زال كشف حسابي يظهر دفعتين بقيمة 249 دولارًا.",
    "Здравствуйте, мне дважды списали деньги за годовой тариф, прошу вернуть одну оплату.",
    "Если вопрос не решится до пятницы, я буду вынужден оспорить платёж через банк.",
    "Γεια σας, χρεώθηκα δύο φορές για το ίδιο τιμολόγιο και περιμένω την επιστροφή.",
    "שלום, חויבתי פעמיים עבור אותה הזמנה ואני מבקש החזר כספי.",
    "أرجو تأكيد ما إذا كان قد تم إصدار المبلغ المسترد، وإن كان كذلك، أرسلوا لي الرقم المرجعي.",
]

WORDS = ["billing", "refund", "invoice", "outage", "login", "upgrade", "contract", "shipping", "privacy", "security",
         "mobile", "desktop", "api", "export", "import", "sso", "tax", "vat", "legal", "partner"]


def req(questions: dict, state=TICKET) -> dict:
    return {"model": "kev-latest", "state": state, "questions": questions}


def long_text(tok: C.KevTokenizer, sentences: list[str], seed: int, target: int = 1500) -> str:
    """Transcript-like text of about `target` state tokens (stops at the first paragraph reaching it)."""
    rng = random.Random(seed)
    paras: list[str] = []
    text = ""
    while len(tok.user_tokens(text)) < target - 1:
        para = " ".join(rng.choice(sentences) for _ in range(rng.randrange(2, 5)))
        paras.append(f"[{len(paras) + 1}] {para}")
        text = "\n\n".join(paras)
    return text


def new_requests(tok: C.KevTokenizer) -> list[tuple[str, dict]]:
    rng = random.Random(255)
    out: list[tuple[str, dict]] = []

    def choice_n(n: int, described: bool) -> dict:
        crit = {"Billing": "Payments, invoices, refunds" if described else None}
        for i in range(1, n):
            name = f"{rng.choice(WORDS)}-{i:03d}"
            crit[name] = (f"Tickets about {rng.choice(WORDS)} and {rng.choice(WORDS)}" if described and i % 3 else None)
        return {"type": "choice", "instructions": "Which queue should this ticket go to?", "criteria": crit}

    def score_n(n: int) -> dict:
        return {"type": "score", "instructions": "How urgent is this ticket?",
                "criteria": [f"{i}" if i % 2 else f"Level {i}" for i in range(n)]}

    out.append(("choice-255", req({"queue": choice_n(255, described=False)})))
    out.append(("score-255", req({"urgency": score_n(255)}, state="Our whole team is locked out since 09:00. Please help!")))
    out.append(("choice-100-described", req({"queue": choice_n(100, described=True)})))
    out.append(("options-16-32-64", req({
        "q16": choice_n(16, described=True),
        "q32": score_n(32),
        "q64": choice_n(64, described=False),
        "refund": dict(NOUL),
    })))
    out.append(("options-128-200", req({"q128": score_n(128), "q200": choice_n(200, described=False)},
                                       state="Short state.")))
    out.append(("long-cjk-1500", req({
        "refund": {"type": "noul", "instructions": "客户是否要求退款？"},
        "team": {"type": "choice", "instructions": "应该由哪个团队处理？",
                 "criteria": {"账单": "付款、发票、退款", "技术": "故障、登录问题", "销售": None}},
        "lang": {"type": "choice", "instructions": "言語は？", "criteria": {"中文": None, "日本語": None, "English": None}},
    }, state=long_text(tok, CJK_SENTENCES, seed=1))))
    out.append(("long-arabic-cyrillic-1500", req({
        "refund": {"type": "noul", "instructions": "هل يطلب العميل استرداد المبلغ؟"},
        "chargeback": {"type": "noul", "instructions": "Угрожает ли клиент оспорить платёж?",
                       "criteria": {"true": "Да, упоминает банк", "false": "Нет"}},
        "lang": {"type": "choice", "instructions": "Which scripts appear?",
                 "criteria": {"Arabic": "العربية", "Cyrillic": "Кириллица", "Greek": "Ελληνικά", "Hebrew": "עברית"}},
    }, state=long_text(tok, ARABIC_SENTENCES, seed=2))))
    out.append(("short-greek-hebrew", req({
        "refund": {"type": "noul", "instructions": "Ζητά ο πελάτης επιστροφή χρημάτων;"},
        "mood": {"type": "score", "instructions": "עד כמה הלקוח כועס?", "criteria": ["רגוע", "מתוסכל", "כועס מאוד", "זועם"]},
    }, state="Γεια σας! חויבתי פעמיים. Ευχαριστώ.")))
    out.append(("short-one-token-state", req({"yes": {"type": "noul"}, "pick": {"type": "choice", "criteria": {"A": None, "B": None}}},
                                            state="?")))
    return out


def main() -> int:
    tok = C.KevTokenizer(ROOT / "fixtures" / "release" / "kev" / "tokenizer.json")
    if REQ.exists():
        shutil.rmtree(REQ)
    REQ.mkdir(parents=True)
    for name in COPIED:
        shutil.copyfile(ROOT / "fixtures" / "requests" / "valid" / f"{name}.json", REQ / f"{name}.json")
    for name, body in new_requests(tok):
        (REQ / f"{name}.json").write_text(json.dumps(body, ensure_ascii=False), encoding="utf-8")
    ref = OUT / "reference-synthetic.json"
    cmd = [sys.executable, str(ROOT / "tools" / "reference" / "reference_arm.py"),
           "--base", "fixtures/release/base", "--kev", "fixtures/release/kev",
           "--requests", "fixtures/accept/requests", "--out", str(ref.relative_to(ROOT)),
           "--arms", "reference,merged_bf16,torch_bf16"]
    subprocess.run(cmd, cwd=ROOT, check=True)
    doc = json.loads(ref.read_text(encoding="utf-8"))
    questions = sum(len(r.get("questions", [])) for r in doc["requests"])
    rows = sum(len(q["row_ids"]) for r in doc["requests"] for q in r.get("questions", []))
    rejected = [r["name"] for r in doc["requests"] if "status" in r]
    print(f"{len(doc['requests'])} requests, {questions} questions, {rows} row tokens, rejected {rejected}")
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())
