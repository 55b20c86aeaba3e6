"""Kev decisions from Python.

``kev.Model`` loads a Kev model in-process with the native kev engine and answers SystemOne request
bodies exactly as ``kev serve`` and ``kev decide`` do: the same loader, validation, rows, shared-state
passes, prepared-state cache and pointer head, so a response here is the server's response body for the
same model and request.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from . import _kev

__all__ = ["Model", "Server", "ContractError", "KevError", "Request", "__version__"]
__version__: str = _kev.__version__

Request = Union[Mapping[str, Any], str, bytes, bytearray, memoryview]
PathLike = Union[str, "os.PathLike[str]"]

# Requests handed to the engine per call: the progress line moves this often, and the engine packs
# each call's requests into passes by token budget, as the server does.
_CHUNK = 64


class ContractError(ValueError):
    """A request the server would refuse: ``status`` (422, or 400) and ``body`` (the error body)."""

    status: int
    body: Any

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        super().__init__(status, body)

    def __str__(self) -> str:
        return f"{self.status}: {_message(self.body)}"


class KevError(RuntimeError):
    """A failure of ours on an accepted request (the server would answer 500)."""


def _message(body: Any) -> str:
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, dict) and "message" in detail:
        return str(detail["message"])
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        loc = ".".join(str(p) for p in first.get("loc", []))
        return f"{first.get('msg', first)} (at {loc})" if loc else str(first.get("msg", first))
    return json.dumps(body, ensure_ascii=False)


def _body(request: Request) -> bytes:
    """A request as the bytes a client would POST: bytes as they are, text as UTF-8, a mapping as JSON."""
    if isinstance(request, bytes):
        return request
    if isinstance(request, (bytearray, memoryview)):
        return bytes(request)
    if isinstance(request, str):
        return request.encode("utf-8")
    if isinstance(request, Mapping):
        return json.dumps(request, ensure_ascii=False).encode("utf-8")
    raise TypeError(f"a request is a dict, str or bytes, not {type(request).__name__}")


def _chunks(items: Iterable[Request], n: int) -> Iterator[List[bytes]]:
    chunk: List[bytes] = []
    for item in items:
        chunk.append(_body(item))
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Progress:
    def __init__(self, enabled: bool, total: Optional[int]) -> None:
        self.enabled, self.total, self.done = enabled, total, 0

    def step(self, n: int) -> None:
        if not self.enabled:
            return
        self.done += n
        of = f"/{self.total}" if self.total is not None else ""
        sys.stderr.write(f"\rkev: {self.done}{of} requests")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


class Model:
    """A Kev model loaded in this process.

    Name the model as the CLI does: ``model_dir`` (a directory written by ``kev prepare``), or ``base`` and
    ``kev`` (the two release directories; the LoRA is merged at load), or ``release`` — ``"kev-4b"``,
    ``"kev-0.8b"`` or ``"kev-9b"`` — for the published release as ``kev serve --release`` serves it: prepared
    (downloaded, verified against its pins, merged) into ``model_dir``, or the kev cache (``$KEV_HOME`` or
    ``~/.cache/kev``), the first time. ``weights`` is ``"merged"`` or
    ``"exact"`` (LoRA unmerged in fp32; needs ``base``/``kev``); ``precision`` is ``"fp32"``, ``"bf16"`` or
    ``"int8"`` (default: bf16 where the CPU has AVX512_BF16, else fp32); ``cache_bytes`` bounds the
    prepared-state cache (0 turns it off; default an eighth of the memory the loaded model leaves free, at
    most 4 GiB). ``pass_tokens`` is the most tokens one forward pass takes (default 4096, as ``kev decide``); ``threads`` gives the model a thread
    pool of its own (default: the process-wide pool, sized by ``RAYON_NUM_THREADS`` or the core count).

    The service options are ``kev serve``'s, applied by the same library code, so the same options give the same
    answers byte for byte: ``truncate_state`` reads only the first 65,536 tokens of an over-long state instead of
    refusing it (``--truncate-states``); ``calibration`` is a file ``kev calibrate`` wrote, whose temperatures
    the head serves (``--calibration``); ``date_facts`` adds a sentence per pair of dates to states naming two or
    more (``--date-facts``); ``max_questions``, ``max_options`` and ``max_input_tokens`` are the per-request work
    caps (default 1,024 / 16,384 / 131,072; a request over one is refused with status 413).

    Several Kev adapters over one base (``kev serve --adapter``): ``base`` and ``adapters={name: dir, ...}``
    instead of ``kev``. A request's ``model`` picks the adapter; the first (or ``default_adapter``) answers
    ``kev-latest``, ``jev-latest`` and, unless ``strict_models``, any other name. Every adapter is applied
    unmerged (the exact weight form), so each answers as ``Model(base=…, kev=its dir, weights="exact")``.

    ``demo=True`` (and no other model) loads kev-mini, the bundled miniature ``kev serve --demo`` serves (its card
    says so). ``aliases`` are further model names (``--alias``); ``pin_bytes`` (``--pin-bytes``, 1 GiB),
    ``max_batch_requests`` and ``max_batch_input_tokens`` (``--max-batch-…``) are ``kev serve``'s too, and matter
    to the in-process server (:meth:`server`).
    """

    def __init__(
        self,
        model_dir: Optional[PathLike] = None,
        base: Optional[PathLike] = None,
        kev: Optional[PathLike] = None,
        weights: str = "merged",
        precision: Optional[str] = None,
        cache_bytes: Optional[int] = None,
        *,
        pass_tokens: Optional[int] = None,
        threads: Optional[int] = None,
        truncate_state: bool = False,
        calibration: Optional[PathLike] = None,
        date_facts: bool = False,
        max_questions: Optional[int] = None,
        max_options: Optional[int] = None,
        max_input_tokens: Optional[int] = None,
        adapters: Optional[Mapping[str, PathLike]] = None,
        default_adapter: Optional[str] = None,
        strict_models: bool = False,
        demo: bool = False,
        aliases: Optional[Iterable[str]] = None,
        pin_bytes: Optional[int] = None,
        max_batch_requests: Optional[int] = None,
        max_batch_input_tokens: Optional[int] = None,
        release: Optional[str] = None,
    ) -> None:
        fs = lambda p: None if p is None else os.fspath(p)  # noqa: E731
        listed = None
        if adapters is not None:
            listed = [(str(name), fs(d)) for name, d in adapters.items()]
            if default_adapter is not None:
                if default_adapter not in dict(listed):
                    raise ValueError(f"default_adapter {default_adapter!r}: no adapter has that name")
                listed.sort(key=lambda nd: nd[0] != default_adapter)
        elif default_adapter is not None:
            raise ValueError("default_adapter needs adapters={name: dir, ...}")
        self._engine = _kev.Engine(
            {
                "model_dir": fs(model_dir),
                "base": fs(base),
                "kev": fs(kev),
                "weights": weights,
                "precision": precision,
                "cache_bytes": cache_bytes,
                "pass_tokens": pass_tokens,
                "threads": threads,
                "truncate_state": truncate_state,
                "calibration": fs(calibration),
                "date_facts": date_facts,
                "max_questions": max_questions,
                "max_options": max_options,
                "max_input_tokens": max_input_tokens,
                "max_batch_requests": max_batch_requests,
                "max_batch_input_tokens": max_batch_input_tokens,
                "pin_bytes": pin_bytes,
                "adapters": listed,
                "strict_models": strict_models,
                "demo": demo,
                "aliases": None if aliases is None else [str(a) for a in aliases],
                "release": release,
            }
        )
        self._info: Optional[dict] = None

    @property
    def info(self) -> dict:
        """The model's ``/v1/models`` card (``name`` ``kev-latest``, ``description``, ``x_…`` fields, the calibration
        and date facts in force): the card ``kev serve`` lists for the same model and options."""
        if self._info is None:
            self._info = json.loads(self._engine.card)
        return dict(self._info)

    @property
    def stats(self) -> dict:
        """Counters since load: ``rows``, ``passes``, ``cache_hits``, ``cache_misses``, ``cache_bytes``."""
        return self._engine.stats()

    def decide(self, request: Request) -> dict:
        """Answer one request: the response body ``POST /v1/systemone`` returns.

        Raises ``ContractError`` for a request the server would refuse, ``KevError`` for a failure of ours.
        """
        ((status, text),) = self._engine.decide([_body(request)])
        if status == 200:
            return json.loads(text)
        if status < 500:
            raise ContractError(status, json.loads(text))
        raise KevError(_message(json.loads(text)))

    def decide_many(
        self, requests: Iterable[Request], *, progress: bool = False, errors: str = "inline"
    ) -> List[dict]:
        """Answer many requests together, in order; their rows share forward passes as in the server.

        The GIL is released while they run. ``errors="inline"`` (default) puts ``{"status", "body"}`` in the
        place of a refused or failed request, as ``kev decide --jsonl`` writes; ``errors="raise"`` raises
        ``ContractError`` (or ``KevError``) for the first one instead. ``progress=True`` writes a progress line
        to standard error.
        """
        if errors not in ("inline", "raise"):
            raise ValueError(f"errors is 'inline' or 'raise', not {errors!r}")
        out: List[dict] = []
        for status, text in self._answers(requests, progress):
            body = json.loads(text)
            if status == 200:
                out.append(body)
            elif errors == "raise":
                if status < 500:
                    raise ContractError(status, body)
                raise KevError(_message(body))
            else:
                out.append({"status": status, "body": body})
        return out

    def decide_jsonl(self, requests: Iterable[Request], *, progress: bool = False) -> List[str]:
        """Answer many requests; per request the line ``kev decide --jsonl`` writes for it, byte for byte:
        the compact response body, or ``{"status":…,"body":…}`` for a refused or failed request."""
        return [
            text if status == 200 else f'{{"status":{status},"body":{text}}}'
            for status, text in self._answers(requests, progress)
        ]

    def rows(self, request: Request) -> dict:
        """What a request compiles to, as ``kev rows`` prints it: per question the token ids, positions,
        readout indices and option keys, plus ``state_tokens`` and ``input_tokens``. Runs no model."""
        status, text = self._engine.rows(_body(request))
        if status != 200:
            raise ContractError(status, json.loads(text))
        return json.loads(text)

    def server(self, **options: Any) -> "Server":
        """``kev serve`` in this process over this model, without a socket: see :class:`Server`."""
        return Server(self, **options)

    def _answers(self, requests: Iterable[Request], progress: bool) -> Iterator[tuple]:
        total = len(requests) if hasattr(requests, "__len__") else None  # type: ignore[arg-type]
        bar = _Progress(progress, total)
        try:
            for chunk in _chunks(requests, _CHUNK):
                answers = self._engine.decide(chunk)
                bar.step(len(chunk))
                yield from answers
        finally:
            bar.close()

    def __repr__(self) -> str:
        card = self.info
        return f"kev.Model({card.get('x_base')!r}, weights={card.get('x_weights')!r}, precision={card.get('x_precision')!r})"


Headers = List[Tuple[bytes, bytes]]


class Server:
    """``kev serve`` in-process: kev-server's own application (every route, the one admission pipeline, the
    queue and scheduler, the error table) over a loaded :class:`Model`, answering requests handed to it as
    method, target, headers and body — what ``kev serve`` would answer on a socket, byte for byte. A Ray Serve
    replica (``kev.serve``) is one of these.

    The options are ``kev serve``'s server flags (``None`` keeps its default): ``queue_depth`` (64),
    ``queue_deadline_ms`` (60,000), ``long_lane`` (``"on"``, ``"low"``, ``"off"``), ``max_body`` (8 MiB),
    ``request_timeout_s`` (300), ``admit_permits`` (the core count), ``api_key``, ``metrics_key``,
    ``min_body_rate`` (16 KiB/s); ``pin_id_prefix`` goes before every pinned-state id it makes (a fleet names
    the replica there); ``io_threads`` sizes its async runtime (2). It answers its warm-up decision through
    the pipeline before the constructor returns (``kev serve``'s ``/ready``); the model is shared, not copied.
    """

    def __init__(
        self,
        model: Model,
        *,
        queue_depth: Optional[int] = None,
        queue_deadline_ms: Optional[int] = None,
        long_lane: Optional[str] = None,
        max_body: Optional[int] = None,
        request_timeout_s: Optional[int] = None,
        admit_permits: Optional[int] = None,
        api_key: Optional[str] = None,
        metrics_key: Optional[str] = None,
        min_body_rate: Optional[int] = None,
        pin_id_prefix: Optional[str] = None,
        io_threads: Optional[int] = None,
    ) -> None:
        self.model = model
        self._server = _kev.Server(
            model._engine,
            {
                "queue_depth": queue_depth,
                "queue_deadline_ms": queue_deadline_ms,
                "long_lane": long_lane,
                "max_body": max_body,
                "request_timeout_s": request_timeout_s,
                "admit_permits": admit_permits,
                "api_key": api_key,
                "metrics_key": metrics_key,
                "min_body_rate": min_body_rate,
                "pin_id_prefix": pin_id_prefix,
                "io_threads": io_threads,
            },
        )

    def handle(
        self, method: str, target: str, headers: Iterable[Tuple[bytes, bytes]] = (), body: bytes = b""
    ) -> Tuple[int, Headers, bytes]:
        """Answer one request (``target``: path and query). Returns ``(status, headers, body)`` as ``kev serve``
        sends them, less what its connection adds (``date``, ``content-length``). Releases the GIL; safe to call
        from many threads at once (the requests share engine passes as on a socket)."""
        status, out, data = self._server.handle(method, target, [(bytes(k), bytes(v)) for k, v in headers], bytes(body))
        return status, list(out), data

    async def handle_async(
        self, method: str, target: str, headers: Iterable[Tuple[bytes, bytes]] = (), body: bytes = b""
    ) -> Tuple[int, Headers, bytes]:
        """:meth:`handle` for asyncio: the request runs on the server's own threads and this coroutine resumes
        when it is answered. Cancelling it stops the request as a client hanging up on ``kev serve`` does."""
        status, out, data = await self._server.handle_async(method, target, [(bytes(k), bytes(v)) for k, v in headers], bytes(body))
        return status, list(out), data

    @property
    def ready(self) -> bool:
        """Whether ``/ready`` would answer 200."""
        return self._server.ready

    def close(self) -> None:
        """Stop taking new work (503), finish what was accepted, stop the engine thread."""
        self._server.close()
