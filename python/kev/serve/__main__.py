"""``python -m kev.serve``: the kev Ray Serve application on a local Ray cluster it starts (or on the cluster
``RAY_ADDRESS`` names), serving until Ctrl-C.

    python -m kev.serve --demo --replicas 2 --port 8009       # kev-mini, as `kev serve --demo`
    python -m kev.serve --model models/kev-4b --replicas auto --max-replicas 8 --cpus-per-replica 8
    python -m kev.serve --base BASE --adapter support=DIR --adapter ops=DIR --set strict_models=true

Any field of ``kev.serve.KevServeArgs`` can be set with ``--set NAME=VALUE``.
"""

import argparse
import math
import os
import signal
import sys
import threading
from typing import Any, Dict, List, Optional


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kev.serve", description=__doc__.split("\n\n")[0])
    model = p.add_argument_group("model (as kev serve)")
    model.add_argument("--demo", action="store_true", help="serve kev-mini, the bundled miniature Kev")
    model.add_argument("--model", help="a directory written by `kev prepare`")
    model.add_argument("--base", help="the base release directory")
    model.add_argument("--kev", help="the Kev release directory")
    model.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR", help="an adapter over --base (repeat)")
    fleet = p.add_argument_group("fleet")
    fleet.add_argument("--replicas", default="1", help='a count, or "auto" (autoscaling between --min-replicas and --max-replicas)')
    fleet.add_argument("--min-replicas", type=int)
    fleet.add_argument("--max-replicas", type=int)
    fleet.add_argument("--cpus-per-replica", type=float, default=1.0)
    fleet.add_argument("--no-affinity", action="store_true", help="Ray's default router instead of state affinity")
    fleet.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="any KevServeArgs field")
    http = p.add_argument_group("http")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, default=8009)
    http.add_argument("--name", default="kev", help="the Serve application's name")
    return p.parse_args(argv)


def serve_args(ns: argparse.Namespace) -> Dict[str, Any]:
    args: Dict[str, Any] = {"demo": ns.demo, "cpus_per_replica": ns.cpus_per_replica, "affinity": not ns.no_affinity}
    if ns.model:
        args["model_dir"] = ns.model
    if ns.base:
        args["base"] = ns.base
    if ns.kev:
        args["kev"] = ns.kev
    if ns.adapter:
        args["adapters"] = dict(a.split("=", 1) for a in ns.adapter)
    args["replicas"] = ns.replicas if ns.replicas == "auto" else int(ns.replicas)
    if ns.min_replicas is not None:
        args["min_replicas"] = ns.min_replicas
    if ns.max_replicas is not None:
        args["max_replicas"] = ns.max_replicas
    for item in ns.set:
        name, _, value = item.partition("=")
        args[name.strip()] = value
    return args


def main(argv: Optional[List[str]] = None) -> int:
    ns = parse(argv)
    import ray
    from ray import serve

    from kev.serve import KevServeArgs, build_app

    args = KevServeArgs.model_validate(serve_args(ns))
    replicas = args.max_replicas if args.replicas == "auto" else int(args.replicas)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        need = math.ceil(replicas * args.cpus_per_replica)
        cpus = max(os.cpu_count() or 1, need)
        if need > (os.cpu_count() or 1):
            print(f"kev.serve: {replicas} replicas x {args.cpus_per_replica} CPUs on {os.cpu_count()} cores: oversubscribed", file=sys.stderr)
        ray.init(num_cpus=cpus, include_dashboard=False)
    serve.start(http_options={"host": ns.host, "port": ns.port})
    serve.run(build_app(args), name=ns.name, route_prefix="/")
    print(f"kev.serve: http://{ns.host}:{ns.port} ({args.replicas} replicas, affinity {'on' if args.affinity else 'off'}); Ctrl-C stops", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
