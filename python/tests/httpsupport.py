"""HTTP helpers the Ray Serve tests share: a keep-alive client per thread, `kev serve` as the reference, answers
compared byte for byte less the engine time."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time
from typing import Dict, List, Optional, Tuple

from conftest import kev_bin

Answer = Tuple[int, List[Tuple[str, str]], bytes]

_local = threading.local()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(base: str, method: str, path: str, body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None, timeout: float = 120) -> Answer:
    """One request on this thread's keep-alive connection to `base` (`host:port`)."""
    conns = _local.__dict__.setdefault("conns", {})
    for attempt in (0, 1):
        conn = conns.get(base)
        if conn is None:
            host, port = base.rsplit(":", 1)
            conn = conns[base] = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            hdrs = {"content-type": "application/json", **(headers or {})}
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, [(k.lower(), v) for k, v in resp.getheaders()], data
        except (http.client.HTTPException, ConnectionError, OSError):
            conn.close()
            conns.pop(base, None)
            if attempt:
                raise
    raise AssertionError("unreachable")


def header(answer: Answer, name: str) -> Optional[str]:
    return next((v for k, v in answer[1] if k == name), None)


_LATENCY = re.compile(rb'"x_latency_ms":-?[0-9][0-9.eE+-]*')


def without_latency(body: bytes) -> bytes:
    """The body with every `x_latency_ms` value (the engine's wall time: the one field two runs never share) set
    to 0, every other byte as sent."""
    return _LATENCY.sub(b'"x_latency_ms":0', body)


# The prepared-state cache budget every server in these tests gets: the default (an eighth of the memory free at
# load) differs between processes, and `/v1/models` reports it.
CACHE_BYTES = 256 << 20


class KevServe:
    """`kev serve --demo` on a loopback port: the reference every Ray Serve answer is compared with."""

    def __init__(self, *extra: str, env: Optional[Dict[str, str]] = None) -> None:
        self.port = free_port()
        self.base = f"127.0.0.1:{self.port}"
        full_env = {**os.environ, "RAYON_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [str(kev_bin()), "serve", "--demo", "--host", "127.0.0.1", "--port", str(self.port), "--cache-bytes", str(CACHE_BYTES), *extra],
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kev serve exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                if request(self.base, "GET", "/ready", timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError("kev serve never became ready")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def metric(text: str, name: str) -> float:
    """A Prometheus sample's value (a series without labels)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def cache_counts(base: str, replica: str) -> Tuple[float, float]:
    """(hits, misses) of one replica's prepared-state cache, from its own `/metrics` (asked for by name)."""
    status, headers, body = request(base, "GET", "/metrics", headers={"x-kev-replica": replica})
    assert status == 200, body[:200]
    served_by = next(v for k, v in headers if k == "x-kev-replica")
    assert served_by == replica, (served_by, replica)
    text = body.decode()
    return metric(text, "kev_prepared_state_cache_hits_total"), metric(text, "kev_prepared_state_cache_misses_total")


def state_text(i: int, words: int = 120) -> str:
    """A state long enough to have a cached prefix (over 64 tokens), distinct per `i`."""
    rng = [(i * 7919 + k * 104729) % 9973 for k in range(words)]
    return f"Ticket {i}: " + " ".join(f"w{r}" for r in rng)


def question(j: int) -> dict:
    kinds = [
        {"type": "noul", "instructions": f"Is point {j} raised?"},
        {"type": "choice", "instructions": f"Which team handles part {j}?", "criteria": {"Billing": None, "Technical": None}},
        {"type": "score", "instructions": f"How urgent is item {j}?", "criteria": ["low", "medium", "high"]},
    ]
    return {f"q{j}": kinds[j % 3]}


def decision(i: int, j: int) -> bytes:
    return json.dumps({"state": state_text(i), "questions": question(j)}).encode()
