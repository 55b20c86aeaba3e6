#!/usr/bin/env python3
"""High-priority latency while low-priority work saturates the engine (issue 57's bar: p99 ≤ 3× idle p99).

Starts `kev serve --demo` (or `--kev BIN -- serve flags`), then, in one run:

1. idle: one client sends N high-priority requests one after another (`x_priority: high`) — the idle p50/p99;
2. loaded: `--low-clients` closed-loop clients keep the engine saturated with low-priority requests (longer
   states, more questions) while the same high client sends N more — the loaded p50/p99, and the low
   clients' throughput;
3. the same load with nobody asking a priority (every request `normal`): what the priorities buy.

Prints each phase's figures and the ratio loaded p99 / idle p99 (the bar is ≤ 3). Timings on a shared machine
are noise in absolute terms; the ratio is taken within one run, phases back to back.

    python3 tools/bench/priority.py --kev target/release/kev [--n 200] [--low-clients 6] [-- serve flags]
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time

from batch import serve

SHORT = {
    "cancel": {"type": "noul", "instructions": "Does the customer want to cancel?"},
    "team": {"type": "choice", "criteria": {"Billing": None, "Shipping": "delivery", "Sales": None}},
}
LOW_QUESTIONS = {f"q{k}": {"type": "score", "criteria": ["low", "mid", "high"]} for k in range(6)}


def request(i, priority, words, questions):
    state = f"Ticket {i}: " + " ".join(f"the order {i}-{k} shipped late and the customer asks why" for k in range(words))
    body = {"state": state, "questions": questions}
    if priority:
        body["x_priority"] = priority
    return json.dumps(body).encode()


def one(conn, body):
    t = time.perf_counter()
    conn.request("POST", "/v1/systemone", body=body, headers={"content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit(f"{r.status} {data[:300]!r}")
    return (time.perf_counter() - t) * 1000


def pct(v, p):
    v = sorted(v)
    return v[max(0, min(len(v) - 1, int(round(p / 100 * len(v) + 0.5)) - 1))]


def high_series(port, n, priority, offset):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    out = []
    for i in range(n):
        out.append(one(conn, request(offset + i, priority, 3, SHORT)))
        time.sleep(0.01)
    conn.close()
    return out


def loaded(port, n, clients, high_priority, low_priority, words, offset):
    stop = threading.Event()
    done = [0] * clients

    def low(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        i = 0
        while not stop.is_set():
            one(conn, request(10_000_000 * (k + 1) + offset + i, low_priority, words, LOW_QUESTIONS))
            done[k] += 1
            i += 1
        conn.close()

    threads = [threading.Thread(target=low, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(2)  # the engine saturated before the first high request
    t0 = time.perf_counter()
    before = sum(done)
    highs = high_series(port, n, high_priority, offset)
    wall = time.perf_counter() - t0
    lows = sum(done) - before
    stop.set()
    for t in threads:
        t.join()
    return highs, lows / wall


def summary(name, ms):
    return f"{name}: n {len(ms)}, p50 {statistics.median(ms):.1f} ms, p99 {pct(ms, 99):.1f} ms, max {max(ms):.1f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kev", default="target/release/kev")
    ap.add_argument("--n", type=int, default=200, help="high-priority requests per phase")
    ap.add_argument("--low-clients", type=int, default=6)
    ap.add_argument("--low-words", type=int, default=60, help="repetitions of a 10-word sentence per low state")
    ap.add_argument("serve_args", nargs="*", default=["--demo"])
    a = ap.parse_args()
    proc, port, _ = serve(a.kev, a.serve_args or ["--demo"])
    try:
        idle = high_series(port, a.n, "high", 0)
        high, low_rps = loaded(port, a.n, a.low_clients, "high", "low", a.low_words, 1_000_000)
        plain, plain_rps = loaded(port, a.n, a.low_clients, None, None, a.low_words, 2_000_000)
    finally:
        proc.terminate()
        proc.wait()
    print(summary("high, idle", idle))
    print(summary(f"high beside {a.low_clients} low clients", high) + f"; low throughput {low_rps:.1f} req/s")
    print(summary(f"no priorities, beside {a.low_clients} clients", plain) + f"; their throughput {plain_rps:.1f} req/s")
    ratio = pct(high, 99) / pct(idle, 99)
    print(f"high p99 loaded / idle: {ratio:.2f} (bar ≤ 3); without priorities {pct(plain, 99) / pct(idle, 99):.2f}")
    sys.exit(0 if ratio <= 3 else 1)


if __name__ == "__main__":
    main()
