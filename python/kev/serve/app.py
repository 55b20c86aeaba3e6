"""The kev Ray Serve application: an HTTP ingress and a deployment of kev replicas.

``KevIngress`` takes each HTTP request from Ray Serve's proxy, reads its body (bounded as ``kev serve`` bounds
it), works out its route key (``kev._kev.route_key``: the pinned state it names, or a digest of its state and
adapter) and hands method, target, headers and body to a ``KevReplica`` through a deployment handle whose
router is :class:`kev.serve.router.StateAffinityRouter`. ``KevReplica`` holds one :class:`kev.Model` and a
:class:`kev.Server` over it — ``kev serve``'s own application in-process — and answers with the status, headers
and body that server makes, plus ``X-Kev-Replica``. No request is parsed, validated or answered by Python code:
the bytes a client gets are kev-server's.

Failover: a replica that dies while it holds requests makes their handle calls fail with an actor error; the
ingress sends them again (every decision is idempotent: a pure function of the request and the model), to the
replicas Ray still has, up to ``retries`` times; a 503 a replica answered before doing any work (draining
during a rollout or a scale-down) is sent again too. Nothing accepted is dropped: an answer comes back or, past
the retries, kev's own 503 ``unavailable_error``.
"""

import asyncio
import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

import kev
from kev import _kev

logger = logging.getLogger("ray.serve")

Headers = List[Tuple[bytes, bytes]]

# `kev.Model`'s keyword arguments that `KevServeArgs` carries (the model options of `kev serve`).
MODEL_OPTIONS = (
    "model_dir", "base", "kev", "adapters", "default_adapter", "weights", "precision", "cache_bytes",
    "pass_tokens", "truncate_state", "calibration", "date_facts", "max_questions", "max_options",
    "max_input_tokens", "max_batch_requests", "max_batch_input_tokens", "pin_bytes", "strict_models", "demo",
    "aliases",
)  # fmt: skip
# `kev.Server`'s (the server flags of `kev serve`).
SERVER_OPTIONS = (
    "queue_depth", "queue_deadline_ms", "long_lane", "max_body", "request_timeout_s", "admit_permits",
    "api_key", "metrics_key", "min_body_rate",
)  # fmt: skip

DEFAULT_MAX_BODY = 8 << 20  # kev serve's --max-body


class KevServeArgs(BaseModel):
    """Everything the application is built from: the model and server options of ``kev serve`` (same names as
    :class:`kev.Model` and :class:`kev.Server`; ``None`` keeps ``kev serve``'s default) and the fleet's own."""

    model_config = ConfigDict(extra="forbid")

    # The model (kev.Model): one of model_dir, base + kev, base + adapters, or demo.
    model_dir: Optional[str] = None
    base: Optional[str] = None
    kev: Optional[str] = None
    adapters: Optional[Dict[str, str]] = None
    default_adapter: Optional[str] = None
    weights: str = "merged"
    precision: Optional[str] = None
    cache_bytes: Optional[int] = None
    pass_tokens: Optional[int] = None
    truncate_state: bool = False
    calibration: Optional[str] = None
    date_facts: bool = False
    max_questions: Optional[int] = None
    max_options: Optional[int] = None
    max_input_tokens: Optional[int] = None
    max_batch_requests: Optional[int] = None
    max_batch_input_tokens: Optional[int] = None
    pin_bytes: Optional[int] = None
    strict_models: bool = False
    demo: bool = False
    aliases: Optional[List[str]] = None
    # Each replica's server (kev.Server).
    queue_depth: Optional[int] = None
    queue_deadline_ms: Optional[int] = None
    long_lane: Optional[str] = None
    max_body: Optional[int] = None
    request_timeout_s: Optional[int] = None
    admit_permits: Optional[int] = None
    api_key: Optional[str] = None
    metrics_key: Optional[str] = None
    min_body_rate: Optional[int] = None
    # The fleet.
    replicas: Union[int, str] = Field(1, description='a count, or "auto" (autoscaling between min and max)')
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: float = 8.0
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 300.0
    cpus_per_replica: float = 1.0
    threads_per_replica: Optional[int] = None
    max_ongoing_requests: int = 32
    affinity: bool = True
    imbalance: int = 8
    vnodes: int = 128
    retries: int = 3
    ingress_replicas: int = 1
    ingress_cpus: float = 0.0
    ingress_max_ongoing_requests: int = 1024

    def model_kwargs(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in MODEL_OPTIONS}

    def server_kwargs(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in SERVER_OPTIONS}

    def replica_options(self) -> Dict[str, Any]:
        """``KevReplica.options(...)``: replicas or autoscaling, CPUs, the router."""
        opts: Dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": self.cpus_per_replica},
            # A replica loads its model and answers a warm-up decision before it takes traffic.
            "health_check_period_s": 10,
            "graceful_shutdown_timeout_s": 30,
        }
        if self.replicas == "auto":
            opts["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas,
                # Requests queued at the handles plus running at a replica, per replica.
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s,
            }
        else:
            opts["num_replicas"] = int(self.replicas)
        if self.affinity:
            opts["request_router_config"] = RequestRouterConfig(
                request_router_class="kev.serve.router.StateAffinityRouter",
                request_router_kwargs={"imbalance": self.imbalance, "vnodes": self.vnodes},
            )
        return opts


@dataclass(frozen=True)
class KevCall:
    """One HTTP request as the ingress hands it to a replica, with what the router reads."""

    method: str
    target: str
    headers: Headers
    body: bytes
    #: The pinned state the request names (`x_state_id`, or the id in a `/v1/systemone/states/{id}` path).
    pin: Optional[str]
    #: Where its state lives on the ring (`None`: no state to follow).
    key: Optional[int]
    #: A replica asked for by name (`X-Kev-Replica` on the request), for debugging one replica.
    replica: Optional[str]


def state_key(adapter: str, digest: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(adapter.encode("utf-8") + b"\0" + digest, digest_size=8).digest(), "big")


@serve.deployment(name="KevReplica")
class KevReplica:
    """One ``kev.Model`` and ``kev serve``'s application over it (``kev.Server``), using the replica's CPUs."""

    def __init__(self, args: Dict[str, Any]) -> None:
        a = KevServeArgs.model_validate(args)
        threads = a.threads_per_replica or max(1, int(a.cpus_per_replica))
        # The engine's thread pool is rayon's global one, sized from this on first use (below).
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._tag = self.replica.encode("ascii")
        self.model = kev.Model(**a.model_kwargs())
        # Pinned-state ids start with this replica's id: the router sends requests naming one here.
        self.server = self.model.server(pin_id_prefix=f"{self.replica}-", **a.server_kwargs())
        logger.info("kev replica %s ready (%s threads)", self.replica, threads)

    async def __call__(self, call: KevCall) -> Tuple[int, Headers, bytes]:
        status, headers, body = await self.server.handle_async(call.method, call.target, call.headers, call.body)
        headers.append((b"x-kev-replica", self._tag))
        return status, headers, body

    def stats(self) -> Dict[str, Any]:
        """This replica's counters (``kev.Model.stats``) and its id."""
        return {"replica": self.replica, **self.model.stats}

    def check_health(self) -> None:
        if not self.server.ready:
            raise RuntimeError(f"kev replica {self.replica} is not ready")

    def __del__(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.close()


# Hop-by-hop fields that describe the client's connection, not the request the replica answers.
_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade"}
_REQUEST_ID = b"x-typesafe-request-id"
_STATES = "/v1/systemone/states/"


@serve.deployment(name="KevIngress")
class KevIngress:
    """HTTP in, a replica chosen by state, the replica's answer out unchanged."""

    def __init__(self, replicas: DeploymentHandle, args: Dict[str, Any]) -> None:
        a = KevServeArgs.model_validate(args)
        self.replicas = replicas
        self.retries = max(0, a.retries)
        self.max_body = a.max_body if a.max_body is not None else DEFAULT_MAX_BODY
        names = list(a.adapters or {})
        self.adapters = set(names)
        self.default_adapter = a.default_adapter or (names[0] if names else "")

    def adapter_of(self, model: Optional[str]) -> str:
        """The adapter a request's ``model`` selects, as ``Kev::resolve_model`` does (any other name: the
        default's), so that its states hash with the cache identity they are stored under."""
        return model if model in self.adapters else self.default_adapter

    async def __call__(self, request: Request) -> Response:
        scope = request.scope
        path, target = scope["path"], scope.get("raw_path") or scope["path"].encode("utf-8")
        # Mounted under a route prefix (`route_prefix: /kev`): kev serve's paths are below it.
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path, target = path[len(root) :] or "/", target[len(root.encode("utf-8")) :] or b"/"
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers: Headers = [(k, v) for k, v in scope["headers"] if k not in _HOP]
        rid = next((v for k, v in headers if k == _REQUEST_ID), None)
        if rid is None:
            # As kev serve makes one (`uuid4().hex`), here so that a retried request keeps its id.
            rid = uuid.uuid4().hex.encode("ascii")
            headers.append((_REQUEST_ID, rid))
        wanted = next((v.decode("latin-1") for k, v in headers if k == b"x-kev-replica"), None)
        body = await self._body(request, headers)
        pin, key = self._route(request.method, path, headers, body)
        call = KevCall(request.method, target.decode("latin-1"), headers, body, pin, key, wanted)
        status, out, data = await self._answer(call, rid.decode("latin-1"))
        response = Response(content=data, status_code=status)
        response.raw_headers = [(k, v) for k, v in out if k != b"content-length"] + [
            (b"content-length", str(len(data)).encode("ascii"))
        ]
        return response

    async def _body(self, request: Request, headers: Headers) -> bytes:
        """The body, as much of it as kev serve would read: a declared length over the limit is not read at
        all (the replica answers its 413 from the header), an undeclared one stops one byte past it (413)."""
        declared = next((v for k, v in headers if k == b"content-length"), None)
        try:
            if declared is not None and int(declared) > self.max_body:
                return b""
        except ValueError:
            pass
        chunks, seen = [], 0
        async for chunk in request.stream():
            chunks.append(chunk)
            seen += len(chunk)
            if seen > self.max_body:
                break
        return b"".join(chunks)

    def _route(self, method: str, path: str, headers: Headers, body: bytes) -> Tuple[Optional[str], Optional[int]]:
        if path.startswith(_STATES) and method in ("GET", "DELETE"):
            return unquote(path[len(_STATES) :]), None
        if method != "POST" or not body:
            return None, None
        pin, model, digest = _kev.route_key(headers, body, self.max_body)
        key = state_key(self.adapter_of(model), digest) if digest is not None else None
        return pin, key

    async def _answer(self, call: KevCall, rid: str) -> Tuple[int, Headers, bytes]:
        last = "no replica answered"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
            try:
                status, out, data = await self.replicas.remote(call)
            except RayActorError as e:
                # The replica died (or cannot be reached) holding the request: it was not answered; send it
                # again, to a replica Ray still has (the router dropped the dead one).
                last = f"{type(e).__name__}: {e}"
                logger.warning("request %s: replica lost (%s); sending it again (%d/%d)", rid, type(e).__name__, attempt + 1, self.retries)
                continue
            if status == 503 and attempt < self.retries:
                # kev serve answers 503 only before it does any work (draining, not ready): another replica
                # may take it.
                last = "the replica was draining or not ready"
                continue
            if attempt:
                # For operators: this answer came after `attempt` lost or refusing replicas.
                out = list(out) + [(b"x-kev-retried", str(attempt).encode("ascii"))]
            return status, out, data
        logger.error("request %s: no replica answered after %d tries: %s", rid, self.retries + 1, last)
        status, out, data = _kev.error_answer(
            "unavailable", f"no kev replica could answer the request after {self.retries + 1} tries; retry", rid
        )
        return status, list(out), data


def build_app(args: KevServeArgs) -> serve.Application:
    """The application: ``KevIngress`` in front of ``KevReplica`` replicas. ``args``: a :class:`KevServeArgs`
    or a dict of its fields (``serve run kev.serve:build_app base=DIR kev=DIR replicas=2``, or a serve config
    file's ``args``)."""
    a = args if isinstance(args, KevServeArgs) else KevServeArgs.model_validate(dict(args or {}))
    named = [a.model_dir is not None, a.base is not None and (a.kev is not None or bool(a.adapters)), a.demo]
    if sum(named) != 1:
        raise ValueError(
            "name one model: model_dir (KEV_MODEL), base with kev or adapters (KEV_BASE, KEV_KEV / KEV_ADAPTERS), "
            "or demo (KEV_DEMO=1: kev-mini)"
        )
    fields = a.model_dump()
    replicas = KevReplica.options(**a.replica_options()).bind(fields)
    return KevIngress.options(
        num_replicas=a.ingress_replicas,
        max_ongoing_requests=a.ingress_max_ongoing_requests,
        ray_actor_options={"num_cpus": a.ingress_cpus},
    ).bind(replicas, fields)
