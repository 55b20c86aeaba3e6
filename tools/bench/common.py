"""Shared by the peer scripts: bench token ids, timing, memory, versions, output."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

# Ordinary (non-special) tokens of the Qwen3.5 vocabulary: ids 0..248043. Random rows draw from these.
ORDINARY_VOCAB = 248044
DEFAULT_SEED = 0x6B6576  # "kev"
_MASK = (1 << 64) - 1


def bench_ids(n: int, seed: int = DEFAULT_SEED, vocab: int = ORDINARY_VOCAB) -> list[int]:
    """The first `n` ids of the bench stream: splitmix64 from `seed`, each output modulo `vocab`.

    `kev bench` (crates/bench/src/peers.rs `bench_ids`) draws the same stream, so either side can generate the
    rows and both time the same tokens. A row of n tokens is a prefix of every longer row.
    """
    out = []
    state = seed & _MASK
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & _MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        z ^= z >> 31
        out.append(z % vocab)
    return out


def load_rows(path: Path) -> list[list[int]]:
    """`--ids FILE.json`: a list of rows (lists of token ids) or `{"rows": [...]}`."""
    doc = json.loads(path.read_text())
    rows = doc["rows"] if isinstance(doc, dict) else doc
    if not isinstance(rows, list) or not rows or not all(
            isinstance(r, list) and r and all(isinstance(t, int) and t >= 0 for t in r) for r in rows):
        raise SystemExit(f"{path}: expected a non-empty list of non-empty lists of token ids")
    return rows


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--tokens: expected comma-separated integers, got {text!r}") from None
    if not lengths or any(n <= 0 for n in lengths):
        raise SystemExit("--tokens: lengths must be positive")
    return lengths


def summarize(samples: list[float]) -> dict:
    return {
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "samples_s": samples,
    }


def peak_rss_bytes() -> int:
    """This process's peak resident set (Linux reports KiB)."""
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024


def current_rss_bytes() -> int | None:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return None


def versions(*modules: str) -> dict:
    out = {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine()}
    for name in modules:
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except ImportError:
            out[name] = None
    return out


def torch_info(torch) -> dict:
    info = {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
    }
    try:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch
        pass
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr, seconds since the script started."""
    print(f"[{time.perf_counter() - _T0:8.1f}s] {msg}", file=sys.stderr, flush=True)


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
