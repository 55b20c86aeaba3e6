"""The parts of kev.serve that need no Ray cluster: `kev.Server` (kev serve in-process) against `kev serve`,
the route key, the hash ring, the application's arguments, the serve config and the KubeRay manifest in docs/."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import time

import pytest

from conftest import INVALID, ROOT, VALID
from httpsupport import CACHE_BYTES, header, request, state_text, without_latency

import kev
from kev import _kev


@pytest.fixture(scope="module")
def reference(kev_serve_demo):
    return kev_serve_demo


@pytest.fixture(scope="module")
def server():
    srv = kev.Model(demo=True, cache_bytes=CACHE_BYTES).server(pin_id_prefix="r0-")
    yield srv
    srv.close()


def test_the_in_process_server_answers_as_kev_serve(server, reference):
    assert server.ready
    for i, p in enumerate(VALID + INVALID):
        body, rid = p.read_bytes(), f"inproc{i:03d}"
        status, headers, data = server.handle("POST", "/v1/systemone", [(b"content-type", b"application/json"), (b"x-typesafe-request-id", rid.encode())], body)
        ref = request(reference, "POST", "/v1/systemone", body, {"x-typesafe-request-id": rid})
        assert status == ref[0], (p.name, status, ref[0])
        assert without_latency(data) == without_latency(ref[2]), p.name
        mine = {k.decode(): v.decode() for k, v in headers}
        assert mine.get("content-type") == header(ref, "content-type") and mine.get("x-typesafe-request-id") == rid
    for path in ("/v1/models", "/health", "/ready", "/openapi.json"):
        status, _, data = server.handle("GET", path)
        ref = request(reference, "GET", path)
        assert (status, data) == (ref[0], ref[2]) or path == "/ready", path
    # The awaitable form answers the same.
    body = VALID[0].read_bytes()
    status, _, data = asyncio.run(server.handle_async("POST", "/v1/systemone", [], body))
    assert (status, without_latency(data)) == (200, without_latency(request(reference, "POST", "/v1/systemone", body)[2]))


def test_cancelling_the_awaitable_stops_the_request(server):
    from httpsupport import metric

    def cancelled():
        return metric(server.handle("GET", "/metrics")[2].decode(), "kev_engine_cancelled_total")

    before = cancelled()
    long = json.dumps({"state": state_text(77, words=12000), "questions": {"q": {"type": "noul"}}}).encode()

    async def hang_up():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(server.handle_async("POST", "/v1/systemone", [], long), 0.5)

    asyncio.run(hang_up())
    deadline = time.monotonic() + 30
    while cancelled() < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled() == before + 1
    # The server goes on answering.
    assert server.handle("POST", "/v1/systemone", [], VALID[0].read_bytes())[0] == 200


def test_pinned_ids_carry_the_prefix(server):
    status, _, data = server.handle("POST", "/v1/systemone/states", [], json.dumps({"state": state_text(1, 200)}).encode())
    assert status == 200, data
    pin = json.loads(data)["id"]
    assert pin.startswith("r0-") and len(pin) == 3 + 32
    assert server.handle("DELETE", f"/v1/systemone/states/{pin}")[0] == 200


def test_route_keys_follow_the_state_as_the_server_reads_it():
    def key(body, headers=()):
        return _kev.route_key(list(headers), body if isinstance(body, bytes) else body.encode(), 1 << 20)

    a = key('{"state": {"a": 1, "b": [1, 2]}, "questions": {}}')
    b = key('{"questions":{"x":{"type":"noul"}},"state":{"a":1,"b":[1,2]}}')
    assert a[2] is not None and a == b
    assert key('{"state": {"a": 2}}')[2] != a[2]
    assert key('{"x_state_id": "r1-abc", "model": "ops", "questions": {}}')[:2] == ("r1-abc", "ops")
    batch = key('{"model": "ops", "requests": [{"state": "s1"}, {"x_state_id": "r2-x", "model": "m"}]}')
    assert batch[:2] == ("r2-x", "m")
    first = key('{"model": "ops", "requests": [{"state": "s1"}, {"state": "s2"}]}')
    assert first[1] == "ops" and first[2] == key('{"state": "s1"}')[2]
    assert key('{"states": ["s1", "s2"], "questions": {}}')[2] == first[2]
    assert key('{"request": {"state": "s1", "questions": {}}, "question": "q"}')[2] == first[2]
    plain = b'{"state": "s1", "questions": {}}'
    assert key(gzip.compress(plain), [(b"Content-Encoding", b"GZip")]) == key(plain)
    for unreadable in ("not json", "[1, 2]", '{"state": '):
        assert key(unreadable) == (None, None, None)
    assert key(b"not gzip", [(b"content-encoding", b"gzip")]) == (None, None, None)


ray_serve = pytest.importorskip("ray.serve", reason="skipped: ray[serve] is not installed (pip install 'kev[serve]')")


def test_the_ring_moves_only_the_share_of_a_replica_that_comes_or_goes():
    from kev.serve.router import HashRing, pin_owner

    keys = [random.Random(7).getrandbits(64) for _ in range(1)] + [random.Random(i).getrandbits(64) for i in range(20000)]
    ring = HashRing(128)
    ring.rebuild(["a", "b", "c", "d"])
    before = {k: ring.home(k) for k in keys}
    shares = {m: sum(1 for v in before.values() if v == m) / len(keys) for m in "abcd"}
    assert all(0.17 < s < 0.33 for s in shares.values()), shares  # 128 points each: within ±8 points of 1/4
    ring.rebuild(["a", "b", "c", "d", "e"])
    after = {k: ring.home(k) for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    assert all(after[k] == "e" for k in moved)  # only to the newcomer
    assert 0.12 < len(moved) / len(keys) < 0.28
    ring.rebuild(["a", "b", "d", "e"])
    gone = {k: ring.home(k) for k in keys}
    assert all(gone[k] == after[k] for k in keys if after[k] != "c")  # only c's states move
    assert ring.home(keys[0], among={"b"}) == "b"
    assert list(ring.walk(keys[0]))[0] == gone[keys[0]] and len(set(ring.walk(keys[0]))) == 4
    assert (pin_owner("r1-abc"), pin_owner("abc"), pin_owner(None)) == ("r1", None, None)


def test_arguments_from_the_environment_and_the_builder():
    from kev.serve import KevServeArgs, args_from_env, build_app

    a = args_from_env(
        {"KEV_MODEL": "/m", "KEV_REPLICAS": "auto", "KEV_MAX_REPLICAS": "6", "KEV_TRUNCATE_STATES": "true",
         "KEV_ADAPTERS": "support=/a,ops=/b", "KEV_ALIASES": "x, y", "KEV_AFFINITY": "false", "KEV_QUEUE_DEPTH": "16"}
    )  # fmt: skip
    assert (a.model_dir, a.replicas, a.max_replicas, a.truncate_state, a.affinity, a.queue_depth) == ("/m", "auto", 6, True, False, 16)
    assert a.adapters == {"support": "/a", "ops": "/b"} and a.aliases == ["x", "y"]
    opts = a.replica_options()
    assert opts["autoscaling_config"]["max_replicas"] == 6 and "request_router_config" not in opts
    opts = KevServeArgs(demo=True, replicas=3).replica_options()
    assert opts["num_replicas"] == 3
    assert opts["request_router_config"].request_router_class == "kev.serve.router.StateAffinityRouter"
    with pytest.raises(ValueError, match="name one model"):
        build_app({})
    with pytest.raises(ValueError, match="name one model"):
        build_app({"demo": True, "model_dir": "/m"})
    with pytest.raises(Exception, match="extra"):
        KevServeArgs.model_validate({"demo": True, "replica": 2})
    assert build_app({"demo": True}) is not None


def test_the_serve_config_in_docs_builds():
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from kev.serve import KevServeArgs

    config = yaml.safe_load((ROOT / "docs" / "ray" / "kev-serve.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    (app,) = schema.applications
    assert app.import_path == "kev.serve:build_app" and app.route_prefix == "/"
    args = KevServeArgs.model_validate(app.args)
    assert args.replicas == "auto" and args.min_replicas >= 1 and args.max_replicas >= args.min_replicas


def test_the_kuberay_manifest_in_docs():
    import jsonschema
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from kev.serve import KevServeArgs

    manifest = yaml.safe_load((ROOT / "docs" / "ray" / "rayservice.yaml").read_text())
    schema = json.loads((ROOT / "docs" / "ray" / "rayservice.schema.json").read_text())
    jsonschema.validate(manifest, schema)
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    (app,) = ServeDeploySchema.model_validate(serve_config).applications
    args = KevServeArgs.model_validate(app.args)
    cluster = manifest["spec"]["rayClusterConfig"]
    workers = cluster["workerGroupSpecs"][0]
    # The workers' CPUs hold the replicas the autoscaler may ask for.
    cpus = int(workers["rayStartParams"]["num-cpus"])
    assert cpus >= args.cpus_per_replica and workers["maxReplicas"] * cpus >= args.max_replicas * args.cpus_per_replica
    assert cluster["rayVersion"] == "2.60.0"
    # A manifest with a typo is refused: the schema is not a formality.
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplica"] = 4
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
