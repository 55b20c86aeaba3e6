#!/usr/bin/env python3
"""`/v1/systemone/batch` against `/v1/systemone` on one `kev serve`, on loopback, interleaved.

Starts `kev serve` (the binary and model flags given; default `--demo`), then per round: 64 states × 3 questions
sent as 64 sequential requests on one keep-alive connection, and the same 64 as one batch; checks every batch
result is byte-equal to the request answered alone (engine time removed), and prints medians and the ratio. Also
times one request of 20 short questions against one of 1 question on a ~1,500-token state, and a new question on
that state pinned (`POST /v1/systemone/states`, then `x_state_id`) against the whole request.

    python3 tools/bench/batch.py --kev target/release/kev [--rounds 5] [-- serve flags ...]
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORDS = ("refund invoice login crash upgrade delivery password billing late broken thanks cancel discount "
         "error account shipping order charge twice support team manager weekend screen update").split()


def state(i, words):
    return " ".join(WORDS[(i * 7 + k * 3 + k * k) % len(WORDS)] for k in range(words)) + f". Ticket {i}."


QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "team": {"type": "choice", "instructions": "Which team should answer?",
             "criteria": {"Billing": "payments, invoices", "Tech": "bugs, crashes", "Sales": None}},
    "anger": {"type": "score", "instructions": "How angry is the customer?", "criteria": ["calm", "annoyed", "furious"]},
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def serve(kev, args):
    """Start `kev serve --port P ARGS` (its log kept aside) and wait until `/ready`: (process, port, seconds)."""
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([kev, "serve", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "KEV_LOG": "warn"})
    t0 = time.time()
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"kev serve exited: {log.read()[-2000:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/ready")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.time() - t0 > 900:
            proc.kill()
            raise SystemExit("kev serve never became ready")
        time.sleep(0.2)
    return proc, port, time.time() - t0


def post(conn, path, body):
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit(f"{path}: {r.status} {data[:300]!r}")
    return json.loads(data)


def timeless(v):
    v = dict(v)
    v.pop("x_latency_ms", None)
    return json.dumps(v, sort_keys=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kev", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--states", type=int, default=64)
    ap.add_argument("--words", type=int, default=60)
    ap.add_argument("--long-words", type=int, default=1470, help="words of the long state (≈ 1,500 tokens)")
    ap.add_argument("serve", nargs="*", default=["--demo"])
    a = ap.parse_args()
    proc, port, _ = serve(a.kev, a.serve)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        card = json.loads((conn.request("GET", "/v1/models"), conn.getresponse().read())[1])["models"][0]
        reqs = [{"state": state(i, a.words), "questions": QUESTIONS} for i in range(a.states)]
        bodies = [json.dumps(r).encode() for r in reqs]
        batch = json.dumps({"requests": reqs}).encode()
        # Warm both paths once (and fill nothing: states differ round to round by their ticket number).
        seq, bat = [], []
        for rnd in range(a.rounds + 1):
            # Fresh states each round, so the prepared-state cache does not serve one path from the other's work.
            reqs = [{"state": state(i, a.words) + f" Round {rnd}.", "questions": QUESTIONS} for i in range(a.states)]
            bodies = [json.dumps(r).encode() for r in reqs]
            reqs2 = [{"state": state(i, a.words) + f" Round {rnd}b.", "questions": QUESTIONS} for i in range(a.states)]
            batch = json.dumps({"requests": reqs2}).encode()
            t = time.perf_counter()
            alone = [post(conn, "/v1/systemone", b) for b in bodies]
            ts = time.perf_counter() - t
            t = time.perf_counter()
            got = post(conn, "/v1/systemone/batch", batch)
            tb = time.perf_counter() - t
            if rnd > 0:
                seq.append(ts)
                bat.append(tb)
            # Byte-equality, on the same states: the batch's states answered alone.
            if rnd == a.rounds:
                for r, b in zip(got["results"], reqs2):
                    one = post(conn, "/v1/systemone", json.dumps(b).encode())
                    assert timeless(r) == timeless(one), (r, one)
        # 20 short questions against 1 on a ~1,500-token state.
        long_state = state(999, a.long_words)
        q1 = {"q0": {"type": "noul", "instructions": "Is it urgent?"}}
        q20 = {f"q{i}": {"type": "noul", "instructions": f"Is point {i} raised?"} for i in range(20)}
        one_t, twenty_t = [], []
        for rnd in range(a.rounds):
            s = long_state + f" Round {rnd}."
            t = time.perf_counter()
            r1 = post(conn, "/v1/systemone", json.dumps({"state": s, "questions": q1}).encode())
            one_t.append(time.perf_counter() - t)
            s = long_state + f" Round {rnd}b."
            t = time.perf_counter()
            post(conn, "/v1/systemone", json.dumps({"state": s, "questions": q20}).encode())
            twenty_t.append(time.perf_counter() - t)
        # A new question on a pinned state against the whole request on a fresh state of the same length.
        full_t, pinned_t = [], []
        for rnd in range(a.rounds):
            s = long_state + f" Pin {rnd}."
            pin = post(conn, "/v1/systemone/states", json.dumps({"state": s}).encode())
            t = time.perf_counter()
            post(conn, "/v1/systemone", json.dumps({"x_state_id": pin["id"], "questions": q1}).encode())
            pinned_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            post(conn, "/v1/systemone", json.dumps({"state": long_state + f" Full {rnd}.", "questions": q1}).encode())
            full_t.append(time.perf_counter() - t)
            conn.request("DELETE", f"/v1/systemone/states/{pin['id']}")
            conn.getresponse().read()
        out = {
            "model": card.get("description"),
            "states": a.states, "questions": 3, "words_per_state": a.words, "rounds": a.rounds,
            "sequential_s": statistics.median(seq), "batch_s": statistics.median(bat),
            "batch_speedup": statistics.median(s / b for s, b in zip(seq, bat)),
            "long_state_tokens": r1["usage"]["input_tokens"],
            "one_question_s": statistics.median(one_t), "twenty_questions_s": statistics.median(twenty_t),
            "twenty_over_one": statistics.median(t2 / t1 for t1, t2 in zip(one_t, twenty_t)),
            "full_request_s": statistics.median(full_t), "pinned_question_s": statistics.median(pinned_t),
            "pinned_over_full": statistics.median(p / f for p, f in zip(pinned_t, full_t)),
            "byte_equal": True,
        }
        print(json.dumps(out, indent=2))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
