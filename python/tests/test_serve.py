"""kev.serve on a real local Ray cluster (the session's, shared with test_ray.py): two kev-mini replicas behind
the state-affinity router (app `kev`, at `/`) and two behind Ray's default router (app `kev-p2c`, at `/p2c`),
compared with `kev serve --demo` on the same machine.

- every fixture request, valid and invalid, and a batch of them: the status and body `kev serve` sends, byte
  for byte less the engine time (`x_latency_ms`), the same `content-type`, request id and `retry-after`, and
  `X-Kev-Replica` naming a replica; `/v1/models` byte-equal; a gzip body answered as the plain one;
- pinned states: made on one replica, named by their id, answered there byte-equal to the plain request;
  unpinned → the 404 `kev serve` gives for an id it does not hold;
- the official SDK round trip (typesafe-sdk, zstd bodies) against the Ray Serve address;
- a state asked five times lands on one replica, whose cache hits 4 times; over a trace of states asked 5
  times each, the hit rate with affinity against Ray's default router, both measured from the replicas' own
  counters;
- a replica killed under load: every request answered, equal to `kev serve`'s answer, some of them retried on
  the other replica; a state pinned on the dead replica → `kev serve`'s 404.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import INVALID, ROOT, VALID
from httpsupport import CACHE_BYTES, cache_counts, decision, free_port, header, metric, question, request, state_text, without_latency

serve = pytest.importorskip("ray.serve", reason="skipped: ray[serve] is not installed (pip install 'kev[serve]')")

COMMON = {"demo": True, "replicas": 2, "cpus_per_replica": 0.5, "threads_per_replica": 1, "cache_bytes": CACHE_BYTES}
RID = "x-typesafe-request-id"


class Fleet:
    def __init__(self, base: str) -> None:
        self.base = base
        self.seen: set = set()

    def ask(self, method, path, body=None, headers=None, prefix=""):
        answer = request(self.base, method, prefix + path, body, headers)
        replica = header(answer, "x-kev-replica")
        assert replica, f"no X-Kev-Replica on {path}: {answer[1]}"
        self.seen.add(replica)
        return answer


@pytest.fixture(scope="module")
def reference(kev_serve_demo):
    return kev_serve_demo


@pytest.fixture(scope="module")
def fleet(ray_cluster):
    from kev.serve import build_app

    port = free_port()
    t0 = time.perf_counter()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(dict(COMMON)), name="kev", route_prefix="/")
    serve.run(build_app({**COMMON, "affinity": False}), name="kev-p2c", route_prefix="/p2c")
    print(f"\nkev.serve: two apps of 2 replicas each ready in {time.perf_counter() - t0:.1f} s")
    yield Fleet(f"127.0.0.1:{port}")
    serve.shutdown()


def same_answer(ours, theirs, what):
    assert ours[0] == theirs[0], (what, ours[0], theirs[0], ours[2][:300], theirs[2][:300])
    assert without_latency(ours[2]) == without_latency(theirs[2]), (what, ours[2][:400], theirs[2][:400])
    for name in ("content-type", RID, "retry-after", "www-authenticate"):
        assert header(ours, name) == header(theirs, name), (what, name, header(ours, name), header(theirs, name))


def test_every_fixture_request_is_kev_serves_answer(fleet, reference):
    bodies = [(p.name, p.read_bytes()) for p in VALID + INVALID]
    for i, (name, body) in enumerate(bodies):
        hdrs = {RID: f"fixture{i:04d}"}
        same_answer(fleet.ask("POST", "/v1/systemone", body, hdrs), request(reference, "POST", "/v1/systemone", body, hdrs), name)
    # The same bodies gzip-coded (the route key is read through the server's own decoder).
    for name, body in bodies[:5]:
        packed, hdrs = gzip.compress(body), {"content-encoding": "gzip", RID: "gz"}
        same_answer(fleet.ask("POST", "/v1/systemone", packed, hdrs), request(reference, "POST", "/v1/systemone", packed, hdrs), name)
    batch = json.dumps({"requests": [json.loads(p.read_bytes()) for p in VALID]}).encode()
    same_answer(fleet.ask("POST", "/v1/systemone/batch", batch, {RID: "batch"}), request(reference, "POST", "/v1/systemone/batch", batch, {RID: "batch"}), "batch")
    for path in ("/v1/models", "/health", "/v1/nowhere"):
        same_answer(fleet.ask("GET", path, headers={RID: "get"}), request(reference, "GET", path, headers={RID: "get"}), path)
    assert len(fleet.seen) == 2, fleet.seen


def test_pinned_states_live_on_their_replica(fleet, reference):
    state = state_text(9001, words=200)
    pin_body = json.dumps({"state": state, "ttl_s": 600}).encode()
    ours, theirs = fleet.ask("POST", "/v1/systemone/states", pin_body), request(reference, "POST", "/v1/systemone/states", pin_body)
    assert ours[0] == theirs[0] == 200, (ours, theirs)
    mine, ref = json.loads(ours[2]), json.loads(theirs[2])
    for k in ("tokens", "bytes", "ready", "usage"):
        assert mine[k] == ref[k], (k, mine, ref)
    owner = header(ours, "x-kev-replica")
    assert mine["id"].startswith(owner + "-"), (mine["id"], owner)
    plain = json.dumps({"state": state, "questions": {"q": {"type": "noul", "instructions": "Is it a ticket?"}}}).encode()
    named = json.dumps({"x_state_id": mine["id"], "questions": {"q": {"type": "noul", "instructions": "Is it a ticket?"}}}).encode()
    named_ref = named.replace(mine["id"].encode(), ref["id"].encode())
    for _ in range(3):
        a = fleet.ask("POST", "/v1/systemone", named)
        assert header(a, "x-kev-replica") == owner
        assert a[0] == 200, a[2][:300]
        assert without_latency(a[2]) == without_latency(request(reference, "POST", "/v1/systemone", named_ref)[2])
        assert without_latency(a[2]) == without_latency(request(reference, "POST", "/v1/systemone", plain)[2])
    got = fleet.ask("GET", f"/v1/systemone/states/{mine['id']}")
    assert got[0] == 200 and header(got, "x-kev-replica") == owner and json.loads(got[2])["id"] == mine["id"]
    gone = fleet.ask("DELETE", f"/v1/systemone/states/{mine['id']}")
    assert (gone[0], json.loads(gone[2])) == (200, {"id": mine["id"], "deleted": True})
    # Unpinned: the 404 kev serve gives for an id it does not hold, for the same id.
    for method, path, body in (("GET", f"/v1/systemone/states/{mine['id']}", None), ("POST", "/v1/systemone", named)):
        same_answer(fleet.ask(method, path, body, {RID: "pin"}), request(reference, method, path, body, {RID: "pin"}), path)
    assert request(reference, "DELETE", f"/v1/systemone/states/{ref['id']}")[0] == 200


def test_official_sdk_round_trip(fleet):
    pytest.importorskip("typesafe_sdk", reason="skipped: typesafe-sdk is not installed (tools/python/test.sh installs it)")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "conformance" / "sdk_roundtrip.py"), f"http://{fleet.base}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    print("\n" + out.stdout.strip())


def replicas_of(fleet, prefix, want=2, tries=200):
    """The replicas of the app at `prefix`: the `X-Kev-Replica` of refused requests (no `questions`: 422, no
    engine work) about different states, which the affinity router spreads by state and Ray's by chance."""
    seen = set()
    for i in range(tries):
        seen.add(header(fleet.ask("POST", "/v1/systemone", json.dumps({"state": f"probe {i}"}).encode(), prefix=prefix), "x-kev-replica"))
        if len(seen) == want:
            return seen
    raise AssertionError(f"saw only {seen} of {want} replicas at {prefix or '/'}")


def counts_of(fleet, prefix, replicas, tries=200):
    """Every replica's (hits, misses), each read from its own /metrics. With affinity the request names the
    replica; Ray's default router ignores the name, so its replicas are asked until each has answered."""
    found = {}
    for _ in range(tries):
        for r in sorted(replicas - set(found)):
            status, headers, body = request(fleet.base, "GET", prefix + "/metrics", headers={"x-kev-replica": r})
            assert status == 200
            by = header((status, headers, body), "x-kev-replica")
            if by not in found:
                text = body.decode()
                found[by] = (metric(text, "kev_prepared_state_cache_hits_total"), metric(text, "kev_prepared_state_cache_misses_total"))
        if set(found) >= replicas:
            return found
    raise AssertionError(f"could not read /metrics of {replicas - set(found)} at {prefix or '/'}")


def run_trace(fleet, prefix, states, offset, threads=4):
    """Each state asked 5 questions in separate requests, rounds interleaved (a state's questions never in
    flight together), 4 at a time; the replicas' cache hit rate over the trace."""
    replicas = replicas_of(fleet, prefix)
    before = counts_of(fleet, prefix, replicas)
    bodies = [decision(offset + i, j) for j in range(5) for i in range(states)]
    with ThreadPoolExecutor(threads) as pool:
        answers = list(pool.map(lambda b: fleet.ask("POST", "/v1/systemone", b, prefix=prefix), bodies))
    assert all(a[0] == 200 for a in answers), [a[2][:200] for a in answers if a[0] != 200][:3]
    after = counts_of(fleet, prefix, replicas)
    hits = sum(after[r][0] - before[r][0] for r in replicas)
    misses = sum(after[r][1] - before[r][1] for r in replicas)
    return hits / max(1.0, hits + misses), hits, misses


def test_a_state_stays_on_its_replica_and_its_cache_hits(fleet, capsys):
    replicas = replicas_of(fleet, "")
    before = {r: cache_counts(fleet.base, r) for r in replicas}
    answers = [fleet.ask("POST", "/v1/systemone", decision(5000, j)) for j in range(5)]
    assert all(a[0] == 200 for a in answers)
    homes = {header(a, "x-kev-replica") for a in answers}
    assert len(homes) == 1, homes
    (home,) = homes
    hits, misses = (x - y for x, y in zip(cache_counts(fleet.base, home), before[home]))
    assert (hits, misses) == (4, 1), (hits, misses)
    states = 16
    on = run_trace(fleet, "", states, offset=6000)
    off = run_trace(fleet, "/p2c", states, offset=7000)
    with capsys.disabled():
        print(
            f"\ncache hit rate, 2 replicas, {states} states x 5 questions in separate requests (ideal 0.8): "
            f"state affinity {on[0]:.3f} ({on[1]:.0f} hits / {on[2]:.0f} misses), "
            f"Ray's default router {off[0]:.3f} ({off[1]:.0f} / {off[2]:.0f})"
        )
    assert on[0] >= 0.75, on
    assert off[0] <= on[0] - 0.1, (on, off)


def test_a_replica_killed_under_load(fleet, reference, ray_cluster, capsys):
    from kev import _kev
    from kev.serve.app import state_key
    from kev.serve.router import HashRing

    ray = ray_cluster
    replicas = replicas_of(fleet, "")
    pin = fleet.ask("POST", "/v1/systemone/states", json.dumps({"state": state_text(8000, words=200)}).encode())
    assert pin[0] == 200, pin[2][:300]
    pin_id, victim = json.loads(pin[2])["id"], header(pin, "x-kev-replica")
    survivor = (replicas - {victim}).pop()
    # Requests whose states live on the victim (the ring the router builds, over the same replicas), long
    # enough to be in flight when it dies, and as many elsewhere.
    ring = HashRing(128)
    ring.rebuild(replicas)
    homed = {victim: [], survivor: []}
    i = 0
    while min(len(v) for v in homed.values()) < 16:
        body = json.dumps({"state": state_text(20000 + i, words=400), "questions": question(i)}).encode()
        _, _, digest = _kev.route_key([], body, 8 << 20)
        home = ring.home(state_key("", digest))
        if len(homed[home]) < 16:
            homed[home].append(body)
        i += 1
    bodies = [b for pair in zip(homed[victim], homed[survivor]) for b in pair]
    expected = [request(reference, "POST", "/v1/systemone", b) for b in bodies]
    answered, lock = [], threading.Lock()

    def send(k):
        a = request(fleet.base, "POST", "/v1/systemone", bodies[k], {RID: f"load{k:03d}"})
        with lock:
            answered.append(k)
        return a

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(send, k) for k in range(len(bodies))]
        while len(answered) < 6:
            time.sleep(0.02)
        t_kill = time.perf_counter()
        ray.kill(ray.get_actor(f"SERVE_REPLICA::kev#KevReplica#{victim}", namespace="serve"), no_restart=True)
        answers = [f.result() for f in futures]
    took = time.perf_counter() - t_kill
    assert len(answers) == len(bodies) == len(set(answered))
    retried = [a for a in answers if header(a, "x-kev-retried")]
    for k, (a, e) in enumerate(zip(answers, expected)):
        assert a[0] == 200, (k, a[2][:300])
        assert without_latency(a[2]) == without_latency(e[2]), k
    # The victim's states (every other body) answered by another replica: sent there after it died — by Ray's
    # router (a request the replica had not accepted yet) or by the ingress (`X-Kev-Retried`: one it held).
    moved = [a for a in answers[0::2] if header(a, "x-kev-replica") != victim]
    with capsys.disabled():
        print(
            f"\nreplica {victim} killed with {len(bodies) - 6} of {len(bodies)} requests unanswered: all answered, "
            f"{len(moved)} of its states by another replica ({len(retried)} of them retried by the ingress) in "
            f"{took:.1f} s, by {sorted({header(a, 'x-kev-replica') for a in answers})}"
        )
    assert moved, "no request of the killed replica's was answered elsewhere: the failover path was not exercised"
    # Its pinned state died with it: the typed not-found kev serve gives for an id it does not hold.
    named = json.dumps({"x_state_id": pin_id, "questions": {"q": {"type": "noul"}}}).encode()
    for method, path, body in (("POST", "/v1/systemone", named), ("GET", f"/v1/systemone/states/{pin_id}", None)):
        ours = fleet.ask(method, path, body, {RID: "dead-pin"})
        assert ours[0] == 404, ours[2][:300]
        same_answer(ours, request(reference, method, path, body, {RID: "dead-pin"}), path)
