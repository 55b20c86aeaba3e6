#!/usr/bin/env python3
"""Issue 54's bars from the JSON reports `tools/bench/kev9b_bars.sh` wrote (standard library only).

    python3 tools/bench/kev9b_summary.py OUT_DIR        # prints the tables, writes OUT_DIR/bars.json

Backbone (`backbone-<isa>.json`, `kev bench backbone` on the 9B synthetic release, peers in the same run): at each
length, kev's fastest arm (every arm timed: fp32, bf16, int8 are all inside the fidelity bar on kev-mini;
`kev accept` checks it on the real weights) against
  * llama.cpp's fastest 8- or 16-bit run (BF16, F16, Q8_0: whichever were timed) — at least 1.5×;
  * ik_llama.cpp's fastest 8- or 16-bit run (Q8_0 with run-time repacking, F16 when timed) — at least 1.5×;
  * ik_llama.cpp's fastest run of any quantisation (its Q4_K_M included) — at least 1.0×.
Decide (`decide-<isa>.json`, case `1q-json-190`): the median over the timed requests per arm, against the
3.94 s of the public Kev-9B CPU port (fp32 on an Apple M3 Ultra CPU). Serve (`serve-<arm>.json`): peak RSS per arm
against 11 GiB (int8) and 19 GiB (bf16, fp32).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EIGHT_OR_SIXTEEN = {
    "llama.cpp": ["llama.cpp bf16", "llama.cpp f16", "llama.cpp q8_0"],
    "ik_llama.cpp": ["ik_llama.cpp f16", "ik_llama.cpp q8_0"],
}
ANY_IK = ["ik_llama.cpp f16", "ik_llama.cpp q8_0", "ik_llama.cpp q4_k_m"]
PORT_S = 3.94
BAR_LENGTHS = (94, 380, 1518)
RSS_BARS_GIB = {"int8": 11.0, "bf16": 19.0, "fp32": 19.0}


def fastest(peers: list, names: list, tokens: int):
    best = None
    for p in peers:
        if p["name"] not in names:
            continue
        for r in p["rows"]:
            if r["tokens"] == tokens and r.get("median_s") and r["median_s"] > 0:
                if best is None or r["median_s"] < best[1]:
                    best = (p["name"], r["median_s"])
    return best


def backbone_bars(report: dict) -> list:
    out = []
    rows, peers = report["rows"], report.get("peers", [])
    for tokens in sorted({r["tokens"] for r in rows}):
        ours = min((r for r in rows if r["tokens"] == tokens and r["median_s"] > 0), key=lambda r: r["median_s"])
        groups = [(f"{fork}'s fastest 8/16-bit run", names, 1.5) for fork, names in EIGHT_OR_SIXTEEN.items()]
        groups.append(("ik_llama.cpp's fastest run of any quantisation", ANY_IK, 1.0))
        for what, names, need in groups:
            best = fastest(peers, names, tokens)
            if best is None:
                out.append({"tokens": tokens, "bar": f"vs {what}", "need": need, "ratio": None, "met": None,
                            "note": "peer not timed"})
                continue
            ratio = best[1] / ours["median_s"]
            out.append({"tokens": tokens, "bar": f"kev {ours['arm']} vs {what} ({best[0]})", "need": need,
                        "kev_s": ours["median_s"], "peer_s": best[1], "ratio": ratio, "met": ratio >= need})
    return out


def main() -> int:
    d = Path(sys.argv[1])
    summary = {"backbone": {}, "decide": {}, "serve": {}}
    for f in sorted(d.glob("backbone-*.json")):
        rep = json.loads(f.read_text())
        isa = f.stem.removeprefix("backbone-")
        m = rep.get("machine", {})
        print(f"\n## backbone, kernels {isa}: {m.get('cpu')} ({m.get('threads')} threads, ISA {m.get('isa')}), "
              f"{m.get('started_utc')} UTC, load {m.get('load_at_start')} -> {m.get('load_at_end')}")
        print("| tokens | " + " | ".join(sorted({r['arm'] for r in rep['rows']})) + " | "
              + " | ".join(p["name"] for p in rep.get("peers", [])) + " |")
        for tokens in sorted({r["tokens"] for r in rep["rows"]}):
            cells = [f"{r['median_s']:.2f}" for r in sorted(rep["rows"], key=lambda r: r["arm"]) if r["tokens"] == tokens]
            for p in rep.get("peers", []):
                rr = [r for r in p["rows"] if r["tokens"] == tokens]
                cells.append(f"{rr[0]['median_s']:.2f}" if rr and rr[0].get("median_s") else "–")
            print(f"| {tokens} | " + " | ".join(cells) + " |")
        bars = backbone_bars(rep)
        for b in bars:
            if b["ratio"] is None:
                print(f"  {b['tokens']:>5}  {b['bar']}: {b['note']}")
            else:
                print(f"  {b['tokens']:>5}  {b['bar']}: {b['ratio']:.2f}x (need {b['need']}x) "
                      f"{'MET' if b['met'] else 'NOT MET'}")
        missing = [t for t in BAR_LENGTHS if t not in {r["tokens"] for r in rep["rows"]}]
        for t in missing:
            print(f"  {t:>5}  not measured in this run: its bars are open, not met")
        summary["backbone"][isa] = {"machine": m, "bars": bars, "lengths_not_measured": missing}
    for f in sorted(d.glob("decide-*.json")):
        rep = json.loads(f.read_text())
        isa = f.stem.removeprefix("decide-")
        print(f"\n## decide 1q-json-190, kernels {isa}")
        res = {}
        for r in rep["results"]:
            if r["case"] != "1q-json-190":
                continue
            med = r["median_s"]
            n = len(r.get("samples_s", []))
            print(f"  {r['arm']}: median {med:.3f} s over {n} requests (the port on an M3 Ultra CPU: {PORT_S} s) "
                  f"{'under' if med < PORT_S else 'NOT under'}")
            res[r["arm"]] = {"median_s": med, "requests": n, "under_port": med < PORT_S}
        summary["decide"][isa] = res
    for f in sorted(d.glob("serve-*.json")):
        rep = json.loads(f.read_text())
        arm = rep["arm"]
        peak = rep["peak_rss_gib"]
        need = RSS_BARS_GIB[arm]
        print(f"\n## serve {arm}: peak RSS {peak:.2f} GiB (bar {need} GiB) {'MET' if peak <= need else 'NOT MET'}; "
              f"cache budget {rep.get('cache_bytes')} bytes; {rep.get('requests')} requests")
        summary["serve"][arm] = {**rep, "met": peak <= need}
    (d / "bars.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
