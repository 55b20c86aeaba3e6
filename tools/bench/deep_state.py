"""Short requests beside a deep state (issue 31's bar): p99 of short decisions while one long state
(default 60,000 tokens) is in flight, against their p99 on an idle server, on one `kev serve`.

usage: python deep_state.py KEV_BIN [--tokens 60000] [--shorts 200] [--serve-args "--demo"]

Prints one JSON object: idle p50/p99, loaded p50/p99 (only the shorts that started and finished while the
long state was in flight count), their ratio, how long the long request took, and whether its answer was
byte-equal to the same request on the idle server afterwards.
"""
import argparse
import http.client
import json
import shlex
import statistics
import sys
import threading
import time

from batch import serve


# One short request every ~10 ms, idle and loaded alike (a closed loop with no pause measures another
# thing: back to back, the idle server never lets its cores sleep).
PAUSE = 0.01


def post(port, body, timeout=1800):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/systemone", body=body, headers={"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def short_body(i):
    return json.dumps({
        "state": f"Ticket {i}: the customer asks where order {i} is and whether it can be cancelled.",
        "questions": {"cancel": {"type": "noul", "instructions": "Does the customer want to cancel?"}},
    }).encode()


def long_body(tokens):
    # About 18 tokens a line with the demo tokenizer; the server reports the exact count.
    lines = [f"Line {k}: the order shipped late and the customer wants a refund.\n" for k in range(tokens // 18)]
    return json.dumps({"state": "".join(lines), "questions": {"q": {"type": "noul"}}}).encode()


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kev")
    ap.add_argument("--tokens", type=int, default=60_000)
    ap.add_argument("--shorts", type=int, default=200)
    ap.add_argument("--serve-args", default="--demo")
    a = ap.parse_args()
    proc, port, _ = serve(a.kev, shlex.split(a.serve_args))
    try:
        for i in range(20):  # warm
            post(port, short_body(-i))
        idle = []
        for i in range(a.shorts):
            t = time.perf_counter()
            s, _ = post(port, short_body(i))
            assert s == 200, s
            idle.append(time.perf_counter() - t)
            time.sleep(PAUSE)
        body = long_body(a.tokens)
        out = {}

        def run_long():
            t = time.perf_counter()
            out["status"], out["body"] = post(port, body)
            out["took"] = time.perf_counter() - t
            out["end"] = time.perf_counter()

        start = time.perf_counter()
        th = threading.Thread(target=run_long)
        th.start()
        time.sleep(0.5)
        loaded = []
        i = 0
        while th.is_alive():
            i += 1
            t = time.perf_counter()
            s, _ = post(port, short_body(100_000 + i))
            assert s == 200, s
            if th.is_alive():
                loaded.append(time.perf_counter() - t)
            time.sleep(PAUSE)
        th.join()
        assert out["status"] == 200, out["body"][:300]
        usage = json.loads(out["body"])["usage"]
        s2, again = post(port, body)
        doc = {
            "serve_args": a.serve_args,
            "long_tokens": usage.get("input_tokens"),
            "long_s": round(out["took"], 2),
            "idle_p50_ms": round(1e3 * statistics.median(idle), 2),
            "idle_p99_ms": round(1e3 * pct(idle, 99), 2),
            "loaded_n": len(loaded),
            "loaded_p50_ms": round(1e3 * statistics.median(loaded), 2) if loaded else None,
            "loaded_p99_ms": round(1e3 * pct(loaded, 99), 2) if loaded else None,
            "loaded_max_ms": round(1e3 * max(loaded), 2) if loaded else None,
            "long_answer_equal_to_cached_rerun": s2 == 200 and json.loads(again)["answers"] == json.loads(out["body"])["answers"],
        }
        if loaded:
            doc["p99_ratio"] = round(pct(loaded, 99) / pct(idle, 99), 2)
        print(json.dumps(doc))
        _ = start
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
