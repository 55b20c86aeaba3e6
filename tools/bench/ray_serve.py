"""kev.serve's bar (issue 58) on one machine: the prepared-state cache hit rate of 2 kev-mini replicas with
state affinity against Ray Serve's default router, and Ray Serve's overhead per request against `kev serve`,
measured pair by pair (the two servers answer the same request alternately, so load from the rest of the
machine falls on both).

    target/python-venv/bin/python tools/bench/ray_serve.py --kev-bin target/debug/kev [--states 40] [--pairs 200]

Starts a local Ray cluster (2 CPUs), two Serve applications of 2 replicas each (affinity at /, Ray's default
router at /p2c, every replica 0.5 CPU and one engine thread) and `kev serve --demo` (one engine thread). Prints a
table and writes --json. Needs `pip install ./python[serve]` in the interpreter that runs it.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def ask(self, method, path, body=None, headers=None):
        self.conn.request(method, path, body=body, headers={"content-type": "application/json", **(headers or {})})
        r = self.conn.getresponse()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()


def state(i, words=120):
    return f"Ticket {i}: " + " ".join(f"w{(i * 7919 + k * 104729) % 9973}" for k in range(words))


def decision(i, j):
    kinds = [
        {"type": "noul", "instructions": f"Is point {j} raised?"},
        {"type": "choice", "instructions": f"Which team handles part {j}?", "criteria": {"Billing": None, "Technical": None}},
        {"type": "score", "instructions": f"How urgent is item {j}?", "criteria": ["low", "medium", "high"]},
    ]
    return json.dumps({"state": state(i), "questions": {f"q{j}": kinds[j % 3]}}).encode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def replicas(port, prefix, want=2, tries=200):
    """The replicas of the app at `prefix`: the `X-Kev-Replica` of refused requests (no `questions`: 422, no
    engine work) about different states, which the affinity router spreads by state and Ray's by chance."""
    c, seen = Client(port), set()
    for i in range(tries):
        seen.add(c.ask("POST", prefix + "/v1/systemone", json.dumps({"state": f"probe {i}"}).encode())[1]["x-kev-replica"])
        if len(seen) == want:
            return seen
    raise SystemExit(f"saw only {sorted(seen)} at {prefix or '/'}")


def replica_counts(port, prefix, names, tries=200):
    """Each replica's (hits, misses) from its own /metrics. The affinity router honours `X-Kev-Replica` on a
    request; Ray's default router does not, so its replicas are asked until each has answered."""
    c, found = Client(port), {}
    for k in range(tries):
        name = sorted(names - set(found))[0]
        status, h, body = c.ask("GET", prefix + "/metrics", headers={"x-kev-replica": name})
        text = body.decode()
        found.setdefault(h["x-kev-replica"], (metric(text, "kev_prepared_state_cache_hits_total"), metric(text, "kev_prepared_state_cache_misses_total")))
        if set(found) >= names:
            return found
    raise SystemExit(f"could not read /metrics of {sorted(names - set(found))} at {prefix or '/'}")


def trace(port, prefix, states, offset, threads):
    names = replicas(port, prefix)
    before = replica_counts(port, prefix, names)
    bodies = [decision(offset + i, j) for j in range(5) for i in range(states)]
    clients = [Client(port) for _ in range(threads)]

    def run(k):
        status, h, body = clients[k % threads].ask("POST", prefix + "/v1/systemone", bodies[k])
        assert status == 200, body[:200]
        return h["x-kev-replica"]

    with ThreadPoolExecutor(threads) as pool:
        for start in range(0, len(bodies), threads):
            list(pool.map(run, range(start, min(start + threads, len(bodies)))))
    after = replica_counts(port, prefix, names)
    hits = sum(after[r][0] - before.get(r, (0, 0))[0] for r in after)
    misses = sum(after[r][1] - before.get(r, (0, 0))[1] for r in after)
    return {"hit_rate": hits / max(1.0, hits + misses), "hits": hits, "misses": misses, "requests": len(bodies)}


def overhead(kev_port, ray_port, pairs, path="/v1/systemone"):
    """p50/p90 of one small request (a 1-question decision on a short state, the same body each time: a cache
    hit on both) through kev serve and through Ray Serve at `path`, alternately, on one keep-alive connection
    each."""
    body = json.dumps({"state": "Charged twice for March.", "questions": {"refund": {"type": "noul"}}}).encode()
    a, b = Client(kev_port), Client(ray_port)
    for c, p in ((a, "/v1/systemone"), (b, path)):
        for _ in range(5):
            c.ask("POST", p, body)
    ta, tb, diffs = [], [], []
    for k in range(pairs):
        order = (a, b) if k % 2 == 0 else (b, a)
        t = {}
        for c in order:
            t0 = time.perf_counter()
            status, _, _ = c.ask("POST", "/v1/systemone" if c is a else path, body)
            t[c] = (time.perf_counter() - t0) * 1000
            assert status == 200
        ta.append(t[a])
        tb.append(t[b])
        diffs.append(t[b] - t[a])
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1]  # noqa: E731
    return {
        "kev_serve_ms": {"p50": statistics.median(ta), "p90": q(ta, 90)},
        "ray_serve_ms": {"p50": statistics.median(tb), "p90": q(tb, 90)},
        "overhead_ms": {"p50": statistics.median(diffs), "p90": q(diffs, 90)},
        "pairs": pairs,
    }


def echo_apps(serve):
    """Ray Serve's own floor on this machine: a deployment that answers fixed bytes at once (one hop, as the
    proxy reaches any ingress), and an ingress that reads the body and calls such a deployment through a
    handle (two hops, as kev.serve's ingress reaches a replica)."""
    from starlette.responses import Response

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Echo:
        async def __call__(self, request):
            await request.body()
            return Response(b'{"ok":true}', media_type="application/json")

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Inner:
        async def __call__(self, body):
            return b'{"ok":true}'

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Outer:
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, request):
            return Response(await self.inner.remote(await request.body()), media_type="application/json")

    serve.run(Echo.bind(), name="echo1", route_prefix="/echo1")
    serve.run(Outer.bind(Inner.bind()), name="echo2", route_prefix="/echo2")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kev-bin", default="target/debug/kev")
    p.add_argument("--states", type=int, default=40)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--json")
    p.add_argument("--cache-bytes", type=int, help="each replica's prepared-state cache (default: kev's)")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--floor", action="store_true", help="also time Ray Serve echo apps of one and two hops")
    args = p.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from kev.serve import build_app

    kev_port = free_port()
    ks = subprocess.Popen([args.kev_bin, "serve", "--demo", "--host", "127.0.0.1", "--port", str(kev_port)],
                          env={**os.environ, "RAYON_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
        ray_port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": ray_port})
        common = {"demo": True, "replicas": 2, "cpus_per_replica": 0.5, "threads_per_replica": 1}
        if args.cache_bytes is not None:
            common["cache_bytes"] = args.cache_bytes
        serve.run(build_app(common), name="kev", route_prefix="/")
        serve.run(build_app({**common, "affinity": False}), name="kev-p2c", route_prefix="/p2c")
        for _ in range(600):
            try:
                if Client(kev_port).ask("GET", "/ready")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        result = {
            "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
            "affinity": trace(ray_port, "", args.states, 100_000, args.threads),
            "default_router": trace(ray_port, "/p2c", args.states, 200_000, args.threads),
        }
        if not args.skip_overhead:
            result["overhead"] = overhead(kev_port, ray_port, args.pairs)
        if args.floor:
            echo_apps(serve)
            result["echo_one_hop"] = overhead(kev_port, ray_port, args.pairs, "/echo1")
            result["echo_two_hops"] = overhead(kev_port, ray_port, args.pairs, "/echo2")
        result["machine"]["load_after"] = os.getloadavg()
    finally:
        ks.terminate()
        try:
            serve.shutdown()
            ray.shutdown()
        except Exception:
            pass
    a, d = result["affinity"], result["default_router"]
    print(f"hit rate, 2 replicas, {args.states} states x 5 questions, {args.threads} at a time: affinity {a['hit_rate']:.3f} "
          f"({a['hits']:.0f}/{a['misses']:.0f}), Ray's default router {d['hit_rate']:.3f} ({d['hits']:.0f}/{d['misses']:.0f})")
    o = result.get("overhead")
    if o:
        print(f"per request, {o['pairs']} pairs: kev serve p50 {o['kev_serve_ms']['p50']:.2f} ms, Ray Serve p50 "
              f"{o['ray_serve_ms']['p50']:.2f} ms, overhead p50 {o['overhead_ms']['p50']:.2f} ms (p90 {o['overhead_ms']['p90']:.2f})")
    print(f"load average {result['machine']['load_before'][0]:.1f} -> {result['machine']['load_after'][0]:.1f} on {os.cpu_count()} cores")
    for name in ("echo_one_hop", "echo_two_hops"):
        if name in result:
            e = result[name]
            print(f"{name}: Ray Serve p50 {e['ray_serve_ms']['p50']:.2f} ms, over kev serve p50 {e['overhead_ms']['p50']:.2f} ms "
                  f"(p90 {e['overhead_ms']['p90']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
