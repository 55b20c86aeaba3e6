"""kev-mini's data: a seeded generator of English decision records, split by *template*.

Five families, each with its own state templates (frames); every template belongs to exactly one split, so the dev
and test splits hold states whose frames never occur in training (the slot phrases — issues, clauses, keywords — are
shared, which is what a model of this size can generalise over):

* `ticket`  — support tickets (text, JSON objects, arrays): refund? (noul), which team? (choice, 2–5 options),
  how angry? (score, 3 levels). The README's example is inside this distribution; its exact state is excluded.
* `review`  — product reviews: sentiment on 3/5/7-level scales, "is it positive?" (noul).
* `route`   — routing a message to one of 2–12 departments (choice, with or without descriptions).
* `json`    — yes/no checks on JSON states: booleans, empty vs non-empty arrays, signs of numbers.
* `urgency` — how urgent is a message, on 3–7-level scales.

A record is `{"id", "family", "template", "request": {"state", "questions"}, "labels": {question id: option key}}`;
the option key is what the answer's probabilities are keyed by: `"true"`/`"false"` for noul, the option name for
choice, the level index as a string (`"0"`, `"1"`, …) for score.
"""

from __future__ import annotations

import json
import random

README_STATE = "Hi, I was charged twice for my March invoice and the refund still has not arrived."
README_QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
             "criteria": {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages", "Sales": None}},
    "anger": {"type": "score", "instructions": "How frustrated is the customer?",
              "criteria": ["Calm", "Frustrated", "Very angry"]},
}
README_LABELS = {"refund": "true", "team": "Billing", "anger": "1"}

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]

# ----------------------------------------------------------------------------------------------------- tickets

# (team, phrases); {m} month, {n} order number
ISSUES = {
    "billing_double": ("Billing", [
        "I was charged twice for my {m} invoice",
        "my card was billed two times for order #{n}",
        "you took the payment twice for my {m} subscription",
        "I see a duplicate charge on my {m} invoice",
        "I was charged twice for order #{n}",
        "the {m} invoice was paid twice from my card",
        "I got charged two times for my {m} plan",
        "there are two charges for order #{n} on my statement",
    ]),
    "billing_wrong": ("Billing", [
        "my {m} invoice shows the wrong amount",
        "I was billed for a plan I cancelled in {m}",
        "the invoice for order #{n} charges me more than the price on your page",
    ]),
    "billing_admin": ("Billing", [
        "I need to update the card on my account",
        "can you send me a copy of my {m} invoice",
        "how do I change the billing address on my invoices",
        "I would like to pay by bank transfer from {m} on",
    ]),
    "technical": ("Technical", [
        "the app crashes every time I open it",
        "I cannot log in since the last update",
        "the dashboard shows error 500 since {m}",
        "the export button does nothing",
        "your service has been down all morning",
        "the sync stopped working after the {m} update",
    ]),
    "sales": ("Sales", [
        "I would like a quote for 50 seats",
        "do you offer a discount for nonprofits",
        "we want to upgrade to the enterprise plan",
        "can someone show us a demo of the team plan",
    ]),
    "shipping": ("Shipping", [
        "my package for order #{n} has not been delivered",
        "the tracking page for order #{n} has not changed in a week",
        "the parcel arrived damaged",
    ]),
    "account": ("Account", [
        "I want to change the email on my profile",
        "please close my account",
        "I forgot my password and the reset email never comes",
    ]),
}
# Follow-up clauses: (text, refund asked, anger added). Refund clauses only follow issues where money was taken.
REFUND_CLAUSES = [
    ("and the refund still has not arrived", True, 1),
    ("and I want my money back", True, 0),
    ("and I would like a refund", True, 0),
    ("so please refund the extra charge", True, 0),
    ("and I am still waiting for my refund", True, 1),
    ("and I need the money returned to my card", True, 0),
    ("and I still have not received my refund", True, 1),
    ("and the money has not come back yet", True, 1),
    ("so I want a refund", True, 0),
    ("and the refund is still missing", True, 1),
]
OTHER_CLAUSES = [
    ("", False, 0),
    ("and nobody has answered my emails", False, 1),
    ("and I need help with it", False, 0),
    ("but I do not want a refund, just a fix", False, 0),
    ("and it is still not fixed after two weeks", False, 1),
]
EMOTIONS = [("", 0), ("Thanks!", 0), ("Thank you for your help.", 0), ("This is really annoying.", 1),
            ("This is the third time I am writing!", 1), ("This is unacceptable!!!", 2),
            ("I am furious and will cancel my account.", 2), ("I am very angry about this.", 2)]
GREETINGS = ["Hi,", "Hello,", "Dear support,", "Hey team,", "Good morning,"]
SIGNS = ["", "Best, Anna", "Regards, Tom", "Thanks, Maria", "- Sam"]
TEAM_DESC = {
    "Billing": ["Payments, invoices, refunds", "Charges and refunds", None],
    "Technical": ["Bugs, outages", "App errors and crashes", None],
    "Sales": [None, "Quotes, plans, upgrades"],
    "Shipping": ["Deliveries, tracking, parcels", None],
    "Account": ["Passwords, profiles, closing accounts", None],
}
ANGER_SCALES = [["Calm", "Frustrated", "Very angry"], ["Not angry", "Somewhat angry", "Very angry"],
                ["calm", "annoyed", "furious"]]
REFUND_Q = ["Is the customer asking for money back?", "Does the customer want a refund?",
            "Is a refund requested?"]
TEAM_Q = ["Which team should handle this ticket?", "Route this ticket to a team.", "Who should answer this?"]
ANGER_Q = ["How frustrated is the customer?", "How angry is the customer?", "Rate the customer's mood."]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:] if s else s


def _ticket_parts(rng: random.Random) -> dict:
    kind = rng.choice(list(ISSUES))
    team, phrases = ISSUES[kind]
    issue = rng.choice(phrases).format(m=rng.choice(MONTHS), n=rng.randrange(1000, 9999))
    money = kind in ("billing_double", "billing_wrong") or (kind in ("technical", "shipping") and rng.random() < 0.3)
    if money and rng.random() < 0.75:
        clause, refund, a1 = rng.choice(REFUND_CLAUSES)
    elif kind in ("technical", "shipping", "billing_double", "billing_wrong"):
        clause, refund, a1 = rng.choice(OTHER_CLAUSES)
    else:
        clause, refund, a1 = rng.choice(OTHER_CLAUSES[:3])
    emotion, a2 = rng.choice(EMOTIONS)
    return {"team": team, "issue": issue, "clause": clause, "refund": refund, "anger": min(2, a1 + a2),
            "emotion": emotion, "greet": rng.choice(GREETINGS), "sign": rng.choice(SIGNS)}


def _sentence(p: dict) -> str:
    body = p["issue"] + (" " + p["clause"] if p["clause"] else "")
    return _cap(body) + "."


def _join(*xs: str) -> str:
    return " ".join(x for x in xs if x)


TICKET_TEMPLATES = {
    "t-greet": lambda p, r: _join(p["greet"], p["issue"] + (" " + p["clause"] if p["clause"] else "") + ".",
                                  p["emotion"]),
    "t-plain-sign": lambda p, r: _join(_sentence(p), p["emotion"], p["sign"]),
    "t-emotion-first": lambda p, r: _join(p["greet"], p["emotion"], _sentence(p)),
    "t-subject": lambda p, r: "Subject: " + _cap(p["issue"].split(" for ")[0]) + "\n\n" + _join(
        p["greet"], _sentence(p), p["emotion"]),
    "t-json": lambda p, r: {"subject": _cap(p["issue"].split(" for ")[0]), "body": _join(_sentence(p), p["emotion"]),
                            "customer": {"plan": r.choice(["free", "pro", "team"]), "tickets": r.randrange(1, 9)}},
    "t-array": lambda p, r: [x for x in (_cap(p["issue"]) + ".", _cap(p["clause"]) + "." if p["clause"] else "",
                                         p["emotion"]) if x],
    "t-nested": lambda p, r: {"ticket": {"channel": r.choice(["email", "chat", "phone"]),
                                         "text": _join(p["greet"], _sentence(p)[:1].lower() + _sentence(p)[1:],
                                                       p["emotion"], p["sign"])}},
    "t-email": lambda p, r: p["greet"] + "\n\n" + _join(_sentence(p), p["emotion"]) + "\n\n" + (p["sign"] or "Thanks"),
    "t-form": lambda p, r: f"Name: {r.choice(['Anna', 'Tom', 'Maria', 'Sam'])}\nOrder: #{r.randrange(1000, 9999)}\n"
                           + "Message: " + _join(_sentence(p), p["emotion"]),
    "t-message": lambda p, r: {"message": _join(p["greet"], _sentence(p), p["emotion"]),
                               "source": r.choice(["web", "app", "email"])},
    "t-transcript": lambda p, r: "Customer: " + _join(p["greet"], _sentence(p)) + "\nAgent: Sorry to hear that."
                                 + ("\nCustomer: " + p["emotion"] if p["emotion"] else ""),
}
TICKET_SPLIT = {"t-greet": "train", "t-plain-sign": "train", "t-subject": "train", "t-json": "train",
                "t-array": "train", "t-email": "train", "t-form": "train", "t-message": "train", "t-emotion-first": "dev", "t-nested": "test", "t-transcript": "test"}


def ticket(rng: random.Random, template: str) -> tuple[object, dict, dict]:
    p = _ticket_parts(rng)
    state = TICKET_TEMPLATES[template](p, rng)
    qs, labels = {}, {}
    which = rng.random()
    if which < 0.25:  # the README's exact questions
        qs = {k: dict(v) for k, v in README_QUESTIONS.items()}
        qs["team"] = dict(qs["team"])
        if p["team"] not in qs["team"]["criteria"]:
            crit = dict(qs["team"]["criteria"])
            crit[p["team"]] = TEAM_DESC[p["team"]][0]
            qs["team"]["criteria"] = crit
        labels = {"refund": "true" if p["refund"] else "false", "team": p["team"], "anger": str(p["anger"])}
        return state, qs, labels
    if rng.random() < 0.8:
        qs["refund"] = {"type": "noul", "instructions": rng.choice(REFUND_Q)}
        labels["refund"] = "true" if p["refund"] else "false"
    if rng.random() < 0.8:
        others = [t for t in TEAM_DESC if t != p["team"]]
        names = [p["team"]] + rng.sample(others, rng.randrange(1, len(others) + 1))
        rng.shuffle(names)
        qs["team"] = {"type": "choice", "instructions": rng.choice(TEAM_Q),
                      "criteria": {n: rng.choice(TEAM_DESC[n]) for n in names}}
        labels["team"] = p["team"]
    if rng.random() < 0.8 or not qs:
        qs["anger"] = {"type": "score", "instructions": rng.choice(ANGER_Q), "criteria": list(rng.choice(ANGER_SCALES))}
        labels["anger"] = str(p["anger"])
    return state, qs, labels


# ----------------------------------------------------------------------------------------------------- reviews

# Six grades from worst to best; level on an L-level scale = round(grade / 5 · (L − 1)), never a tie for L in 3..7.
SENTIMENT = [
    ["it broke after one day and support ignored me", "a complete waste of money", "the worst purchase I have made"],
    ["it is disappointing and feels cheap", "I regret buying it", "it stopped working after a month"],
    ["it is not great, a bit slow", "it works but the battery is weak", "it is below what I expected"],
    ["it is fine for the price", "it does the job, nothing special", "it is decent overall"],
    ["I like it and it works well", "it is a good product", "it is solid and easy to use"],
    ["I love it, absolutely perfect", "the best purchase this year", "it is excellent and I recommend it to everyone"],
]
PRODUCTS = ["blender", "headphones", "desk lamp", "backpack", "coffee maker", "keyboard", "phone case", "kettle"]
SENT_SCALES = [["negative", "neutral", "positive"], ["Bad", "Okay", "Good"],
               ["Very negative", "Negative", "Neutral", "Positive", "Very positive"],
               ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"],
               ["awful", "bad", "poor", "okay", "good", "great", "excellent"]]
REVIEW_TEMPLATES = {
    "r-plain": lambda prod, ph, r: f"I bought this {prod} last month and {ph}.",
    "r-title": lambda prod, ph, r: f"Review of the {prod}: {_cap(ph)}.",
    "r-json": lambda prod, ph, r: {"product": prod, "rating_text": _cap(ph), "verified": r.random() < 0.5},
    "r-stars-missing": lambda prod, ph, r: f"{_cap(ph)}. That is all I can say about this {prod}.",
    "r-list": lambda prod, ph, r: [f"Product: {prod}", f"Comment: {_cap(ph)}."],
    "r-dialog": lambda prod, ph, r: f"Q: What do you think of the {prod}?\nA: Honestly, {ph}.",
    "r-quote": lambda prod, ph, r: f"\"{_cap(ph)}\", a customer wrote about the {prod}.",
    "r-mail": lambda prod, ph, r: f"Hello, about the {prod} I ordered: {ph}.",
    "r-nested": lambda prod, ph, r: {"review": {"item": {"name": prod}, "text": f"My {prod}: {ph}."}},
}
REVIEW_SPLIT = {"r-plain": "train", "r-title": "train", "r-json": "train", "r-list": "train", "r-quote": "train",
                "r-mail": "train",
                "r-stars-missing": "dev", "r-dialog": "test", "r-nested": "test"}


def review(rng: random.Random, template: str):
    grade = rng.randrange(6)
    ph = rng.choice(SENTIMENT[grade])
    state = REVIEW_TEMPLATES[template](rng.choice(PRODUCTS), ph, rng)
    qs, labels = {}, {}
    scale = rng.choice(SENT_SCALES)
    qs["sentiment"] = {"type": "score", "instructions": rng.choice(
        ["How positive is this review?", "Rate the sentiment of the review.", "What is the reviewer's opinion?"]),
        "criteria": list(scale)}
    labels["sentiment"] = str(round(grade / 5 * (len(scale) - 1)))
    if rng.random() < 0.6:
        qs["positive"] = {"type": "noul", "instructions": rng.choice(
            ["Is the review positive?", "Does the reviewer like the product?"])}
        labels["positive"] = "true" if grade >= 3 else "false"
    return state, qs, labels


# ----------------------------------------------------------------------------------------------------- routing

DEPARTMENTS = {
    "Billing": ("Invoices and payments", ["my invoice is wrong", "the payment failed", "I was charged twice"]),
    "Shipping": ("Deliveries and tracking", ["where is my package", "the delivery is late", "tracking shows nothing"]),
    "Returns": ("Sending items back", ["I want to return the shoes", "how do I send this back",
                                       "the return label is missing"]),
    "Technical support": ("Bugs and errors", ["the app crashes", "I get an error on login", "the page will not load"]),
    "Sales": ("New orders and quotes", ["I need a quote for 20 laptops", "we want to buy more licenses",
                                        "what does the enterprise plan cost"]),
    "Legal": ("Contracts and compliance", ["please review this contract", "we need the data processing agreement",
                                           "is this clause compliant"]),
    "Human resources": ("Jobs and staff", ["I want to apply for the open job", "my payslip is missing",
                                           "how many vacation days do I have"]),
    "Marketing": ("Ads and campaigns", ["we want to sponsor your podcast", "can we run a joint campaign",
                                        "I have a question about your newsletter ads"]),
    "Security": ("Breaches and vulnerabilities", ["I found a vulnerability on your site",
                                                  "someone accessed my account without permission",
                                                  "I got a phishing email in your name"]),
    "Facilities": ("Office and building", ["the office heating is broken", "the meeting room lights are out",
                                           "the elevator is stuck again"]),
    "IT": ("Laptops and accounts for staff", ["my work laptop will not start", "I need a new monitor",
                                              "my VPN password expired"]),
    "Finance": ("Budgets and expenses", ["my expense report was rejected", "what is the travel budget",
                                         "the supplier has not been paid"]),
}
ROUTE_TEMPLATES = {
    "ro-hello": lambda kw, r: f"Hello, {kw}. Can you help?",
    "ro-short": lambda kw, r: f"{_cap(kw)}.",
    "ro-json": lambda kw, r: {"from": r.choice(["anna@example.com", "tom@example.org", "ops@example.net"]),
                              "message": _cap(kw) + "."},
    "ro-urgent": lambda kw, r: f"Quick question: {kw}?",
    "ro-forward": lambda kw, r: f"Forwarding this from a colleague: \"{_cap(kw)}.\" Who owns it?",
    "ro-chat": lambda kw, r: ["User: hi", f"User: {kw}", "Bot: Let me find the right team."],
    "ro-help": lambda kw, r: f"I need help: {kw}.",
    "ro-subject": lambda kw, r: {"subject": "Question", "body": _cap(kw) + ". Thanks."},
    "ro-memo": lambda kw, r: f"Note for the desk - caller says {kw}; please pass it on.",
}
ROUTE_SPLIT = {"ro-hello": "train", "ro-short": "train", "ro-json": "train", "ro-urgent": "train", "ro-help": "train",
               "ro-subject": "train",
               "ro-forward": "dev", "ro-chat": "test", "ro-memo": "test"}


def route(rng: random.Random, template: str):
    dept = rng.choice(list(DEPARTMENTS))
    kw = rng.choice(DEPARTMENTS[dept][1])
    state = ROUTE_TEMPLATES[template](kw, rng)
    n = rng.randrange(2, 13)
    names = [dept] + rng.sample([d for d in DEPARTMENTS if d != dept], n - 1)
    rng.shuffle(names)
    desc = rng.random() < 0.5
    qs = {"department": {"type": "choice", "instructions": rng.choice(
        ["Which department should receive this message?", "Route the message.", "Who should handle this?"]),
        "criteria": {d: (DEPARTMENTS[d][0] if desc else None) for d in names}}}
    return state, qs, {"department": dept}


# -------------------------------------------------------------------------------------------------- JSON checks

def _items(rng: random.Random, empty: bool):
    if empty:
        return []
    return [{"sku": f"A{rng.randrange(100, 999)}", "qty": rng.randrange(1, 5)} for _ in range(rng.randrange(1, 4))]


# Each template names the fields differently; (paid key, verified key, items key, balance key, wrapper).
JSON_TEMPLATES = {
    "j-order": ("paid", "verified", "items", "balance", "order"),
    "j-flat": ("is_paid", "is_verified", "lines", "account_balance", None),
    "j-payment": ("payment_received", "verified", "products", "balance", "purchase"),
    "j-list": ("paid", "email_verified", "items", "credit", "list"),
    "j-status": ("paid", "verified", "cart", "balance", "status"),
    "j-deep": ("settled", "confirmed", "entries", "amount_due", "deep"),
    "j-array-first": ("paid", "verified", "items", "balance", "array"),
    "j-buyer-first": ("has_paid", "is_verified", "basket", "balance", "buyer"),
}
JSON_SPLIT = {"j-order": "train", "j-flat": "train", "j-payment": "train", "j-list": "train", "j-buyer-first": "train",
              "j-status": "dev", "j-deep": "test", "j-array-first": "test"}
JSON_QUESTIONS = {
    "paid": ["Has the order been paid?", "Is the payment complete?"],
    "verified": ["Is the customer verified?", "Has the customer been verified?"],
    "items": ["Does the order contain any items?", "Is anything in the order?"],
    "negative": ["Is the balance negative?", "Does the customer owe money?"],
}


def json_check(rng: random.Random, template: str):
    kp, kv, ki, kb, wrap = JSON_TEMPLATES[template]
    paid, verified, empty, negative = (rng.random() < 0.5 for _ in range(4))
    bal = round(rng.uniform(1, 500), 2) * (-1 if negative else 1)
    order = {"id": rng.randrange(1000, 9999), kp: paid, ki: _items(rng, empty)}
    customer = {"name": rng.choice(["Anna", "Tom", "Maria", "Sam", "Lee"]), kv: verified, kb: bal}
    if wrap == "order":
        state = {"order": order, "customer": customer}
    elif wrap is None:
        state = {**order, **customer}
    elif wrap == "purchase":
        state = {"purchase": order, "buyer": customer}
    elif wrap == "list":
        state = [order, customer]
    elif wrap == "status":
        state = {"status": {"order": order, "customer": customer}, "updated": "2024-05-01"}
    elif wrap == "buyer":
        state = {"buyer": customer, "order": order}
    elif wrap == "deep":
        state = {"data": {"record": {"order": order}, "person": customer}}
    else:
        state = [{"customer": customer}, {"order": order}]
    facts = {"paid": paid, "verified": verified, "items": not empty, "negative": negative}
    keys = rng.sample(list(facts), rng.randrange(1, 4))
    qs = {k: {"type": "noul", "instructions": rng.choice(JSON_QUESTIONS[k])} for k in keys}
    return state, qs, {k: "true" if facts[k] else "false" for k in keys}


# ----------------------------------------------------------------------------------------------------- urgency

URGENCY = [  # six grades, least to most urgent (level = round(grade / 5 · (L − 1)))
    ["whenever you have time", "no rush at all", "sometime next month is fine"],
    ["in the next few weeks would be good", "it can wait a while"],
    ["this week if possible", "within a few days please"],
    ["by tomorrow please", "soon, it is blocking some work"],
    ["today please, customers are waiting", "it is urgent, we need it within hours"],
    ["right now, production is down", "immediately, everything is broken", "emergency, all sales have stopped"],
]
URGENCY_SCALES = [["low", "medium", "high"], ["Low", "Normal", "High", "Critical"],
                  ["P4", "P3", "P2", "P1", "P0"], ["none", "low", "some", "high", "very high", "critical"],
                  ["1", "2", "3", "4", "5", "6", "7"]]
URGENCY_TEMPLATES = {
    "u-plain": lambda task, ph, r: f"Please {task}, {ph}.",
    "u-json": lambda task, ph, r: {"request": task, "when": ph},
    "u-note": lambda task, ph, r: f"Can you {task}? {_cap(ph)}.",
    "u-list": lambda task, ph, r: [f"Task: {task}", f"Timing: {ph}"],
    "u-mail": lambda task, ph, r: f"Hi team,\n{_cap(ph)}: {task}.\nThanks",
    "u-ticket": lambda task, ph, r: {"ticket": {"summary": task, "note": _cap(ph)}},
    "u-slack": lambda task, ph, r: f"@here {task} - {ph}",
    "u-form": lambda task, ph, r: f"Request: {task}\nDeadline: {ph}",
}
URGENCY_SPLIT = {"u-plain": "train", "u-json": "train", "u-note": "train", "u-list": "train", "u-form": "train",
                 "u-mail": "dev", "u-ticket": "test", "u-slack": "test"}
TASKS = ["fix the login page", "restart the payment server", "update the price list", "reply to the customer",
         "check the broken report", "send the invoice", "renew the certificate"]


def urgency(rng: random.Random, template: str):
    grade = rng.randrange(6)
    state = URGENCY_TEMPLATES[template](rng.choice(TASKS), rng.choice(URGENCY[grade]), rng)
    scale = rng.choice(URGENCY_SCALES)
    qs = {"urgency": {"type": "score", "instructions": rng.choice(
        ["How urgent is this request?", "What priority should this get?"]), "criteria": list(scale)}}
    return state, qs, {"urgency": str(round(grade / 5 * (len(scale) - 1)))}


FAMILIES = {
    "ticket": (ticket, TICKET_SPLIT, 0.34),
    "review": (review, REVIEW_SPLIT, 0.16),
    "route": (route, ROUTE_SPLIT, 0.2),
    "json": (json_check, JSON_SPLIT, 0.15),
    "urgency": (urgency, URGENCY_SPLIT, 0.15),
}
SIZES = {"train": 1400, "dev": 160, "test": 2400}


def generate(seed: int = 14, sizes: dict | None = None) -> dict[str, list[dict]]:
    """{split: [record, ...]}; deterministic for a seed."""
    sizes = sizes or SIZES
    out = {}
    for si, (split, n) in enumerate(sizes.items()):
        rng = random.Random(seed * 1000 + si)
        fams = list(FAMILIES)
        weights = [FAMILIES[f][2] for f in fams]
        recs, seen = [], set()
        while len(recs) < n:
            fam = rng.choices(fams, weights)[0]
            fn, split_of, _ = FAMILIES[fam]
            templates = sorted(t for t, s in split_of.items() if s == split)
            tpl = rng.choice(templates)
            state, qs, labels = fn(rng, tpl)
            if state == README_STATE:
                continue  # the README example is never a data item
            key = json.dumps([state, qs], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            recs.append({"id": f"{split}-{len(recs):04d}", "family": fam, "template": tpl,
                         "request": {"state": state, "questions": qs}, "labels": labels})
        out[split] = recs
    return out
