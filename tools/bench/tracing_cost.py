#!/usr/bin/env python3
"""What OpenTelemetry traces cost: throughput of `kev serve` without traces against the same server exporting
every request's spans by OTLP/HTTP (issue 57's bar: ≤ 2 % of throughput).

Starts both servers at once (`kev serve --demo`, or the flags after `--`), the second with `--otlp-endpoint`
pointing at a sink on loopback that accepts and discards OTLP/HTTP posts (counting the bytes, so the spans are
seen to arrive). Then alternates rounds — off, on, off, on, … — each sending the same `--requests` requests
over `--clients` keep-alive connections to one server while the other idles, and reports the median throughput
of each and their ratio. Alternating pairs taken in one run cancel most of a shared machine's drift; the
spread of the pairs is printed beside the ratio, and each server's CPU time per request (from /proc), which a
busy machine disturbs less than throughput.

    python3 tools/bench/tracing_cost.py --kev target/release/kev [--rounds 10] [--requests 400] [--clients 4]
"""
import argparse
import http.client
import http.server
import json
import os
import statistics
import sys
import threading
import time

from batch import serve

QUESTIONS = {
    "cancel": {"type": "noul", "instructions": "Does the customer want to cancel?"},
    "team": {"type": "choice", "criteria": {"Billing": None, "Shipping": "delivery", "Sales": None}},
    "tone": {"type": "score", "criteria": ["calm", "annoyed", "angry"]},
}


class Sink(http.server.BaseHTTPRequestHandler):
    received = 0
    posts = 0

    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        Sink.received += n
        Sink.posts += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def cpu_seconds(pid):
    """User + system CPU time of process `pid` so far (seconds)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_trip(port, bodies, clients):
    def worker(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        for i in range(k, len(bodies), clients):
            conn.request("POST", "/v1/systemone", body=bodies[i], headers={"content-type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                raise SystemExit(f"{r.status} {data[:300]!r}")
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(bodies) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kev", default="target/release/kev")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("serve_args", nargs="*", default=["--demo"])
    a = ap.parse_args()
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    args = a.serve_args or ["--demo"]
    off, off_port, _ = serve(a.kev, args + ["--canary-interval-s", "0"])
    on, on_port, _ = serve(a.kev, args + ["--canary-interval-s", "0", "--otlp-endpoint", endpoint])
    rates = {"off": [], "on": []}
    cpu = {"off": [], "on": []}
    pids = {"off": off.pid, "on": on.pid}
    try:
        for r in range(a.rounds):
            # Distinct states each round (no prefix-cache hit carries over), the same for both servers.
            bodies = [json.dumps({"state": f"Round {r}, ticket {i}: the customer asks where order {i} is.",
                                  "questions": QUESTIONS}).encode() for i in range(a.requests)]
            order = [("off", off_port), ("on", on_port)] if r % 2 == 0 else [("on", on_port), ("off", off_port)]
            for name, port in order:
                c0 = cpu_seconds(pids[name])
                rates[name].append(round_trip(port, bodies, a.clients))
                cpu[name].append((cpu_seconds(pids[name]) - c0) / len(bodies) * 1000)
        time.sleep(6)  # the batch processor exports every 5 s
    finally:
        for p in (off, on):
            p.terminate()
            p.wait()
    m_off, m_on = statistics.median(rates["off"]), statistics.median(rates["on"])
    pairs = [b / a_ for a_, b in zip(rates["off"], rates["on"])]
    print(f"traces off: median {m_off:.1f} req/s ({', '.join(f'{x:.0f}' for x in rates['off'])})")
    print(f"traces on:  median {m_on:.1f} req/s ({', '.join(f'{x:.0f}' for x in rates['on'])})")
    print(f"on / off: {m_on / m_off:.4f} (cost {100 * (1 - m_on / m_off):.2f} %; bar ≤ 2 %); "
          f"pairs min {min(pairs):.3f} median {statistics.median(pairs):.3f} max {max(pairs):.3f}")
    c_off, c_on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    print(f"server CPU per request: off {c_off:.3f} ms, on {c_on:.3f} ms (+{100 * (c_on / c_off - 1):.1f} %; "
          f"the exporter's own thread included)")
    print(f"the sink received {Sink.posts} OTLP posts, {Sink.received} bytes")
    if Sink.posts == 0:
        print("no spans arrived: the comparison is void")
        sys.exit(1)
    sys.exit(0 if m_on / m_off >= 0.98 else 1)


if __name__ == "__main__":
    main()
