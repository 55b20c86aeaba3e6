#!/usr/bin/env bash
# Conformance of `kev serve --demo` on loopback: the jevcompat 0.1.1 suite with auth off and with a key
# (every MUST and every SHOULD must pass), the official typesafe-sdk 0.7.5 round trip with zstd, and an
# overload check (4× the queue capacity at once: only 200/429/529, every 200 correct, still ready).
# Reports are kept under $KEV_CI_OUT (default target/ci).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${KEV_BIN:-}" ]; then
  cargo build --locked -p kev
fi
KEV=${KEV_BIN:-target/debug/kev}
OUT=${KEV_CI_OUT:-target/ci}
VENV=${KEV_CONFORMANCE_VENV:-target/conformance-venv}
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/jevcompat" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check jevcompat==0.1.1 "typesafe-sdk[zstd]==0.7.5"
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() { # port [env...] -> starts kev serve --demo, waits for /ready
  local port=$1; shift
  env "$@" "$KEV" serve --demo --host 127.0.0.1 --port "$port" >"$OUT/serve-$port.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do
    if curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "kev serve on port $port never became ready:"; cat "$OUT/serve-$port.log"; return 1
}

open_port=$(free_port)
start "$open_port"
"$VENV/bin/jevcompat" test "http://127.0.0.1:$open_port" --json "$OUT/jevcompat-open.json" \
  --markdown "$OUT/jevcompat-open.md" > "$OUT/jevcompat-open.txt" 2>&1 || true
tail -n 3 "$OUT/jevcompat-open.txt"
"$VENV/bin/python" tools/conformance/check_report.py "$OUT/jevcompat-open.json"
"$VENV/bin/python" tools/conformance/sdk_roundtrip.py "http://127.0.0.1:$open_port"

key_port=$(free_port)
start "$key_port" KEV_API_KEY=ci-secret-key
JEVCOMPAT_KEY=ci-secret-key "$VENV/bin/jevcompat" test "http://127.0.0.1:$key_port" --key-env JEVCOMPAT_KEY \
  --json "$OUT/jevcompat-key.json" --markdown "$OUT/jevcompat-key.md" > "$OUT/jevcompat-key.txt" 2>&1 || true
tail -n 3 "$OUT/jevcompat-key.txt"
"$VENV/bin/python" tools/conformance/check_report.py "$OUT/jevcompat-key.json" --expect-auth
"$VENV/bin/python" tools/conformance/sdk_roundtrip.py "http://127.0.0.1:$key_port" ci-secret-key
# Several adapters on one base (kev-mini and its two fine-tunes), strict model names, through the SDK.
ad_port=$(free_port)
M=fixtures/mini
"$KEV" serve --host 127.0.0.1 --port "$ad_port" --base "$M/base" --adapter "kev=$M/kev" \
  --adapter "support=$M/adapters/support" --adapter "ops=$M/adapters/ops" --strict-models \
  >"$OUT/serve-$ad_port.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
  if curl -fsS "http://127.0.0.1:$ad_port/ready" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
"$VENV/bin/python" tools/conformance/sdk_adapters.py "http://127.0.0.1:$ad_port"
# Overload: 4× the queue capacity at once against the real engine (the demo model), with a short queue
# deadline so both 429 (queue full) and 529 (waited too long) occur.
load_port=$(free_port)
start "$load_port" KEV_QUEUE_DEPTH=4 KEV_QUEUE_DEADLINE_MS=150
python3 tools/conformance/overload.py "http://127.0.0.1:$load_port" 4
echo "conformance: jevcompat (open and keyed), the SDK round trips (one model, several adapters) and the overload check passed"
