"""Shared set-up: the fixture release, the `kev` CLI the answers are compared with, and one loaded model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "fixtures" / "release"
BASE, KEV = RELEASE / "base", RELEASE / "kev"
VALID = sorted((ROOT / "fixtures" / "requests" / "valid").glob("*.json"))
INVALID = sorted((ROOT / "fixtures" / "requests" / "invalid").glob("*.json"))


def kev_bin() -> Path:
    """The CLI to compare with: $KEV_BIN, else the workspace's debug then release build."""
    env = os.environ.get("KEV_BIN")
    candidates = [Path(env)] if env else [ROOT / "target" / "debug" / "kev", ROOT / "target" / "release" / "kev"]
    for c in candidates:
        if c.is_file():
            return c
    # Not a skip: equality with the CLI is what these tests are for.
    raise RuntimeError(f"no kev binary (tried {', '.join(map(str, candidates))}): cargo build -p kev, or set KEV_BIN")


def cli_jsonl(lines: List[str], tmp: Path, *extra: str) -> List[str]:
    """`kev decide --jsonl` over `lines`: the lines it writes."""
    tmp.mkdir(parents=True, exist_ok=True)
    src, out = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    subprocess.run(
        [str(kev_bin()), "decide", "--base", str(BASE), "--kev", str(KEV), "--jsonl", str(src), "--out", str(out), *extra],
        check=True,
        capture_output=True,
    )
    return out.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for every test that needs one (starting Ray is the slow part): loopback only, no
    dashboard, usage stats off, 2 CPUs (the machine's). `ray_decide` (the Ray Data example) importable on it."""
    ray = pytest.importorskip("ray", reason="skipped: ray is not installed (pip install 'kev[serve]')")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    examples = str(ROOT / "python" / "examples")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"PYTHONPATH": examples, "RAY_USAGE_STATS_ENABLED": "0"}},
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def kev_serve_demo():
    """`kev serve --demo` on a loopback port, its address: the reference the kev.serve tests compare with."""
    from httpsupport import KevServe

    ks = KevServe()
    yield ks.base
    ks.close()


@pytest.fixture(scope="session")
def model():
    import kev

    return kev.Model(base=BASE, kev=KEV)


@pytest.fixture(scope="session")
def valid_bodies() -> List[bytes]:
    bodies = [p.read_bytes().rstrip(b"\n") for p in VALID]
    # --jsonl reads one body per line: every valid fixture is one line.
    assert all(b"\n" not in b for b in bodies)
    return bodies


@pytest.fixture(scope="session")
def cli_valid(valid_bodies, tmp_path_factory) -> List[str]:
    return cli_jsonl([b.decode("utf-8") for b in valid_bodies], tmp_path_factory.mktemp("cli-valid"))
