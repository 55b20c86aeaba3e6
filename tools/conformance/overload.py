"""Overload against a running `kev serve` (started with a small --queue-depth and a short queue deadline): a
bounded load generator sends 4× the queue capacity at once. Every response must be 200, 429 or 529 (with
Retry-After); **both 429 (queue full) and 529 (waited past the deadline) must occur** — an unbounded queue or
a deadline that is never applied fails here; every request the server accepted (not 429) must be answered
(200 or 529, no transport error); every 200 must equal the answer the same request gets alone afterwards;
the server's own count of 200s must equal ours (nothing answered twice, nothing lost); and the server must
still be ready.

usage: python overload.py BASE_URL QUEUE_DEPTH
"""
import json
import sys
import threading
import urllib.error
import urllib.request

base, depth = sys.argv[1], int(sys.argv[2])
n = 4 * depth


def post(body):
    req = urllib.request.Request(base + "/v1/systemone", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read()), r.headers.get("retry-after")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), e.headers.get("retry-after")
    except Exception as e:  # no HTTP answer: lost
        return None, {"error": f"{type(e).__name__}: {e}"}, None


def metric_200s():
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("kev_requests_total{") and 'route="/v1/systemone"' in line and 'status="200"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def request(i):
    # Longer than one engine pass, so that the two long requests the engine starts at once keep the others
    # waiting past the deadline (529) while the queue is full (429).
    state = " ".join(f"Line {i}-{k}: the customer writes about order #{1000 + k} and a refund." for k in range(300))
    qs = {f"q{i}-{k}": {"type": "choice", "instructions": f"Which team, case {k}?",
                         "criteria": {"Billing": None, "Technical": None, "Sales": None}} for k in range(6)}
    return {"model": f"load-{i}", "state": state, "questions": qs}


before = metric_200s()
results = [None] * n
threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, post(request(i)))) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()

statuses = [r[0] for r in results]
lost = [r[1] for r in results if r[0] is None]
assert not lost, f"accepted requests got no answer: {lost}"
bad = [s for s in statuses if s not in (200, 429, 529)]
assert not bad, f"unexpected statuses: {statuses}"
assert 429 in statuses, f"no 429: the queue is not bounded ({statuses})"
assert 529 in statuses, f"no 529: the queue deadline is not applied ({statuses})"
for status, body, retry in results:
    if status != 200:
        assert retry is not None, f"{status} without Retry-After: {body}"
        assert body["detail"]["error_type"] in ("rate_limit_error", "overloaded_error"), body
ok = [i for i, r in enumerate(results) if r[0] == 200]
assert ok, "no request was answered"
for i in ok:
    status, alone, _ = post(request(i))
    assert status == 200
    got = results[i][1]
    assert got["answers"] == alone["answers"] and got["usage"] == alone["usage"], f"request {i} differs under load"
    assert got["model"] == f"load-{i}"
after = metric_200s()
# The server's 200s during the burst = ours (+ the len(ok) re-checks just made).
assert after - before == 2 * len(ok), f"server counted {after - before} 200s, clients saw {2 * len(ok)}"
ready = urllib.request.urlopen(base + "/ready", timeout=30).status
assert ready == 200
print(f"overload: {n} concurrent requests at queue depth {depth}: {statuses.count(200)} × 200, "
      f"{statuses.count(429)} × 429, {statuses.count(529)} × 529; every 200 correct, none lost or doubled, still ready")
