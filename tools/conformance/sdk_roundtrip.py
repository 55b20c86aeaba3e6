"""The official Python client (typesafe-sdk 0.7.5, zstd extra) against a running kev server, unchanged.

Sends one noul + choice + score request larger than 1 KiB (so the SDK compresses it with zstd),
checks the typed answers it parses, and lists /v1/models. An httpx2 event hook only *observes* the
outgoing request to prove it really went out zstd-compressed.

usage: python sdk_roundtrip.py BASE_URL [API_KEY]
"""
import math
import sys

import httpx2
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

base_url = sys.argv[1]
api_key = sys.argv[2] if len(sys.argv) > 2 else "no-key-needed"

seen = {}


def observe(request):
    if request.url.path.endswith("/v1/systemone"):
        seen["encoding"] = request.headers.get("content-encoding")
        seen["bytes"] = len(request.content)


state = {
    "subject": "Charged twice for the March invoice",
    "body": " ".join(
        ["I was charged twice for my March invoice (order #4471) and the refund I was promised last week "
         "still hasn't arrived. I've emailed three times."] * 8
    ),
    "customer": {"plan": "pro", "tickets": 3, "since": "2021-04-02"},
}
questions = {
    "refund": Noul(instructions="Is the customer asking for money back?",
                   criteria={"true": "They want a refund or chargeback", "false": "They want anything else"}),
    "team": Choice(instructions="Which team should handle this ticket?",
                   criteria={"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages, integrations",
                             "Sales": "Pricing questions, upgrades, new contracts"}),
    "anger": Score(instructions="How frustrated is the customer?", criteria=["Calm", "Frustrated", "Very angry"]),
}

with TypeSafeClient(api_key=api_key, base_url=base_url, model="kev-latest", compression="zstd",
                    http_client=httpx2.Client(timeout=60, event_hooks={"request": [observe]})) as client:
    result = client.system_one(state=state, questions=questions)
    models = client.models.list()

assert seen.get("encoding") == "zstd", f"the SDK did not compress the body: {seen}"
assert result.model == "kev-latest", result.model
assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0, result.usage
noul = result.nouls["refund"].noul
assert 0.0 <= noul <= 1.0, noul
team = result.choices["team"]
assert team.choice in {"Billing", "Technical", "Sales"}, team
assert set(team.probabilities) == {"Billing", "Technical", "Sales"}
assert abs(sum(team.probabilities.values()) - 1.0) < 0.01
assert team.probabilities[team.choice] == max(team.probabilities.values())
anger = result.scores["anger"]
assert set(anger.probabilities) == {0, 1, 2}, anger.probabilities
assert abs(anger.score - sum(k * p for k, p in anger.probabilities.items())) < 0.01
assert 0.0 <= anger.confidence <= 1.0 and not math.isnan(anger.confidence)
assert anger.legend[0] == "Calm" and anger.legend[2] == "Very angry", anger.legend
names = [m.name for m in models.models]
assert "kev-latest" in names, names
print(f"sdk round trip: ok ({seen['bytes']} bytes sent zstd-compressed; refund={noul}, team={team.choice}, "
      f"anger={anger.score}; models={names})")
