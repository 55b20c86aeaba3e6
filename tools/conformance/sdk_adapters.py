"""The official Python client (typesafe-sdk 0.7.5) against a kev server with several adapters, unchanged.

The server: `kev serve --base fixtures/mini/base --adapter kev=… --adapter support=… --adapter ops=…
--strict-models`. Lists /v1/models through the SDK (one card per adapter besides kev-latest / jev-latest), asks
the same questions with `model=` each adapter (the model echoed, the adapters answering differently), and checks
that an unknown model under strict names reaches the SDK as its 400 error class (TypeSafeBadRequestError), with
the live API's `api_usage_error` body.

usage: python sdk_adapters.py BASE_URL
"""
import sys

from typesafe_sdk import Choice, Noul, TypeSafeBadRequestError, TypeSafeClient

base_url = sys.argv[1]
client = TypeSafeClient(api_key="no-key-needed", base_url=base_url)

names = {m.name for m in client.models.list().models}
for want in ("kev-latest", "jev-latest", "kev", "support", "ops"):
    assert want in names, f"{want} not listed by /v1/models: {sorted(names)}"

state = "Hello, the invoice for order #4380 charges me twice. I want my money back. - Sam"
questions = {
    "refund": Noul(instructions="Is a refund requested?"),
    "team": Choice(instructions="Which team should handle this ticket?",
                   criteria={"Billing": "Payments, invoices, refunds", "Sales": "Quotes, plans, upgrades",
                             "Shipping": "Deliveries, tracking, parcels"}),
}
answers = {}
for model in ("kev", "support", "ops"):
    r = client.system_one(state=state, questions=questions, model=model)
    assert r.model == model, (model, r.model)
    answers[model] = (round(r.nouls["refund"].noul, 4), r.choices["team"].choice)
assert len({a[0] for a in answers.values()}) > 1, f"every adapter answered alike: {answers}"

try:
    client.system_one(state=state, questions=questions, model="kev-9b")
except TypeSafeBadRequestError as e:
    text = str(e) + repr(getattr(e, "body", ""))
    assert "api_usage_error" in text and "Unknown model: kev-9b" in text, text
else:
    raise AssertionError("an unknown model was answered under --strict-models")
print(f"sdk adapters round trip: {len(names)} model cards; answers {answers}; unknown model -> 400 api_usage_error")
