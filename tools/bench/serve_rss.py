#!/usr/bin/env python3
"""Peak resident memory of `kev serve` in one compute arm, serving requests that fill its state cache.

    python3 tools/bench/serve_rss.py --kev target/release/kev --arm int8 --out OUT.json [--requests 8] \\
        [--state-words 1100] -- --base DIR/base --kev DIR/kev

Starts `kev serve --precision ARM --port P` with the model flags after `--`, waits for `/ready`, sends
`--requests` requests with distinct long states (about 1,500 tokens each: support-ticket histories, each a new
state, so every one is computed and cached) and three questions, one at a time, then reads `/metrics`
(`kev_process_peak_resident_bytes`, `kev_prepared_state_cache_bytes`) and the state-cache budget the server chose
(its `starting the server` log line), stops it, and writes `{"arm", "peak_rss_gib", "cache_bytes",
"cache_used_bytes", "requests", "answered", "errors", "load_s", "seconds", "command"}`. The server's request timeout
is --timeout (a busy machine runs a 9B row for minutes). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SENTENCES = [
    "The customer wrote again about invoice {n} and the duplicate charge on the card.",
    "Support replied that the refund for order {n} was issued and should arrive within five days.",
    "Billing found a second subscription on account {n} that was opened by mistake.",
    "The customer asked for a written confirmation and a call in the afternoon.",
    "An agent escalated case {n} to a supervisor after the third email.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body(i: int, words: int) -> bytes:
    text, k = [], 0
    while sum(len(t.split()) for t in text) < words:
        text.append(SENTENCES[k % len(SENTENCES)].format(n=1000 + 37 * i + k))
        k += 1
    state = {"ticket": {"id": 5000 + i, "channel": "email", "history": " ".join(text)}}
    questions = {
        "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                 "criteria": {"Billing": "Payments, refunds", "Technical": "Bugs", "Sales": "Upgrades"}},
        "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
        "anger": {"type": "score", "instructions": "How frustrated is the customer?",
                  "criteria": ["Calm", "Frustrated", "Very angry"]},
    }
    return json.dumps({"state": state, "questions": questions}).encode()


def metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kev", required=True, help="the kev binary")
    ap.add_argument("--arm", required=True, choices=["fp32", "bf16", "int8"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--state-words", type=int, default=1100)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for the load and for each request")
    ap.add_argument("model", nargs=argparse.REMAINDER, help="-- then the model flags of kev serve")
    a = ap.parse_args()
    model = [x for x in a.model if x != "--"]
    port = free_port()
    log = a.out.with_suffix(".log")
    cmd = [a.kev, "serve", "--precision", a.arm, "--port", str(port), "--long-lane", "off",
           "--request-timeout-s", str(int(a.timeout)), *model]
    t0 = time.time()
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env={**os.environ, "KEV_LOG_FORMAT": "text"})
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"kev serve exited ({proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(f"{base}/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() - t0 > a.timeout:
                raise SystemExit("kev serve did not become ready")
            time.sleep(2)
        load_s = time.time() - t0
        print(f"[serve_rss] {a.arm}: ready after {load_s:.0f}s", file=sys.stderr, flush=True)
        answered, errors = 0, []
        for i in range(a.requests):
            req = urllib.request.Request(f"{base}/v1/systemone", data=body(i, a.state_words),
                                         headers={"content-type": "application/json"})
            t = time.time()
            try:
                with urllib.request.urlopen(req, timeout=a.timeout) as r:
                    usage = json.loads(r.read())["usage"]
            except OSError as e:  # recorded; the memory figures are still read
                errors.append(f"request {i}: {e}")
                continue
            answered += 1
            print(f"[serve_rss] request {i}: {usage['input_tokens']} tokens, {time.time() - t:.1f}s",
                  file=sys.stderr, flush=True)
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
            text = r.read().decode()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    budget = None
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())  # the log's colour codes
    m = re.search(r"starting the server.*?cache_bytes[=:] ?(\d+)", plain)
    if m:
        budget = int(m.group(1))
    peak = metric(text, "kev_process_peak_resident_bytes")
    out = {
        "arm": a.arm,
        "peak_rss_gib": peak / 2**30 if peak else None,
        "cache_bytes": budget,
        "cache_used_bytes": metric(text, "kev_prepared_state_cache_bytes"),
        "requests": a.requests,
        "answered": answered,
        "errors": errors,
        "load_s": load_s,
        "seconds": time.time() - t0,
        "command": " ".join(cmd),
    }
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
