#!/usr/bin/env python3
"""Several Kev adapters on one resident base against one adapter per server, on loopback.

Starts `kev serve --base BASE --kev FIRST --weights exact` (one adapter) and times N requests (distinct states,
3 questions each, `--clients` keep-alive connections); then `kev serve --base BASE --adapter a=… --adapter b=…
--adapter c=…` and times the same N requests with `model` alternating a, b, c. Checks that every request the
multi-adapter server answered with the first adapter is byte-equal to the single-adapter server's answer
(latency removed), and prints the throughput ratio and both servers' peak RSS (VmHWM) beside the adapters' own
bytes (`/v1/models`' `x_adapter_bytes`).

    python3 tools/bench/adapters.py --kev target/release/kev --base DIR --adapter a=DIR --adapter b=DIR \\
        --adapter c=DIR [--requests 24] [--clients 2] [--words 150] [-- serve flags ...]
"""
import argparse
import http.client
import json
import sys
import threading
import time

from batch import QUESTIONS, post, serve, state, timeless


def vm_hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run(port, bodies, clients):
    """Send `bodies` over `clients` connections (body i on connection i % clients); answers in order."""
    out = [None] * len(bodies)

    def worker(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        for i in range(k, len(bodies), clients):
            out[i] = post(conn, "/v1/systemone", bodies[i])
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0


def models(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["models"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kev", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", action="append", required=True, help="NAME=DIR (three or more)")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--words", type=int, default=150)
    ap.add_argument("extra", nargs="*", help="more `kev serve` flags (after --)")
    a = ap.parse_args()
    adapters = [x.split("=", 1) for x in a.adapter]
    names = [n for n, _ in adapters]
    bodies_single, bodies_multi = [], []
    for i in range(a.requests):
        req = {"state": state(i, a.words), "questions": QUESTIONS}
        bodies_single.append(json.dumps(req).encode())
        bodies_multi.append(json.dumps({"model": names[i % len(names)], **req}).encode())

    proc, port, load_s = serve(a.kev, ["--base", a.base, "--kev", adapters[0][1], "--weights", "exact", *a.extra])
    single, t_single = run(port, bodies_single, a.clients)
    rss_single = vm_hwm(proc.pid)
    proc.terminate()
    proc.wait()
    print(f"single adapter: loaded in {load_s:.0f} s; {a.requests} requests in {t_single:.1f} s "
          f"({a.requests / t_single:.3f}/s); peak RSS {rss_single / 2**30:.2f} GiB", flush=True)

    flags = ["--base", a.base]
    for n, d in adapters:
        flags += ["--adapter", f"{n}={d}"]
    proc, port, load_s = serve(a.kev, [*flags, *a.extra])
    cards = {m["name"]: m for m in models(port)}
    multi, t_multi = run(port, bodies_multi, a.clients)
    rss_multi = vm_hwm(proc.pid)
    proc.terminate()
    proc.wait()
    own = [cards[n].get("x_adapter_bytes", 0) for n in names]
    print(f"{len(names)} adapters: loaded in {load_s:.0f} s; {a.requests} requests in {t_multi:.1f} s "
          f"({a.requests / t_multi:.3f}/s); peak RSS {rss_multi / 2**30:.2f} GiB; adapters' own bytes "
          + ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in zip(names, own)), flush=True)

    same = 0
    for i in range(0, a.requests, len(names)):
        s, m = dict(single[i]), dict(multi[i])
        m["model"] = s["model"]
        if timeless(s) != timeless(m):
            raise SystemExit(f"request {i}: the first adapter's answer differs from its single-adapter server")
        same += 1
    bound = rss_single + sum(own[1:])
    print(f"byte-equal to the single-adapter server: {same}/{same} of the first adapter's requests")
    print(f"throughput multi/single {t_single / t_multi:.3f}x (bar >= 0.85); peak RSS {rss_multi / 2**30:.2f} GiB "
          f"= {rss_multi / bound:.3f}x (single + the other adapters' bytes = {bound / 2**30:.2f} GiB; bar <= 1.10)")


if __name__ == "__main__":
    sys.exit(main())
