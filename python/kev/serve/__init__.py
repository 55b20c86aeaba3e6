"""kev on Ray Serve: ``kev serve``'s API across many replicas, routed by state.

``serve run kev.serve:app`` (configured from the environment, ``kev serve``'s variable names:
``KEV_MODEL``, ``KEV_BASE`` + ``KEV_KEV``, ``KEV_DEMO=1``, ``KEV_REPLICAS``, …), ``serve run
kev.serve:build_app base=DIR kev=DIR replicas=2``, a serve config file (``docs/ray/kev-serve.yaml``), or
``python -m kev.serve --demo --replicas 2 --port 8009``. Each replica is one :class:`kev.Model` answering
through :class:`kev.Server` (``kev serve``'s own application, in-process), so every answer is the one ``kev
serve`` gives, byte for byte, plus an ``X-Kev-Replica`` header naming the replica that computed it.
"""

import os
from typing import Any, Dict, Mapping, Optional

try:
    from ray import serve as _serve  # noqa: F401
except ImportError as e:  # pragma: no cover - what a user without the extra sees
    raise ImportError("kev.serve needs Ray Serve: pip install 'kev[serve]'") from e

from .app import KevCall, KevIngress, KevReplica, KevServeArgs, build_app
from .router import HashRing, StateAffinityRouter

__all__ = ["KevCall", "KevIngress", "KevReplica", "KevServeArgs", "HashRing", "StateAffinityRouter", "app", "args_from_env", "build_app"]

# Environment names that are not `KEV_` + the field's name: kev serve's own spellings.
_RENAMED = {"model_dir": "KEV_MODEL", "truncate_state": "KEV_TRUNCATE_STATES"}
_LISTS = {"aliases"}


def args_from_env(environ: Optional[Mapping[str, str]] = None) -> KevServeArgs:
    """:class:`KevServeArgs` from the environment: each field from ``KEV_<FIELD>`` (``KEV_MODEL`` for
    ``model_dir`` and ``KEV_TRUNCATE_STATES`` for ``truncate_state``, as ``kev serve`` names them),
    ``KEV_ADAPTERS`` as ``name=dir,name=dir``, ``KEV_ALIASES`` comma-separated."""
    env = os.environ if environ is None else environ
    found: Dict[str, Any] = {}
    for field in KevServeArgs.model_fields:
        name = _RENAMED.get(field, "KEV_" + field.upper())
        value = env.get(name)
        if value is None or value == "":
            continue
        if field == "adapters":
            pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise ValueError(f"{name}: expected name=dir,name=dir, got {value!r}")
            found[field] = {k.strip(): d.strip() for k, d in pairs}
        elif field in _LISTS:
            found[field] = [v.strip() for v in value.split(",") if v.strip()]
        else:
            found[field] = value
    return KevServeArgs.model_validate(found)


def __getattr__(name: str) -> Any:
    # `serve run kev.serve:app`: built when asked for, from the environment.
    if name == "app":
        return build_app(args_from_env())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
