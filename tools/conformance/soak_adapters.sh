#!/usr/bin/env bash
# The operations soak (issue 57): `kev serve` on kev-mini from its release files with two adapters served at
# start (kev, the default, and support: untouched, their answers checked byte for byte throughout) while ops
# is added and removed every 30 s through the admin routes, under soak.py's mixed load (priorities, deadlines,
# long states, bursts, malformed, oversized, slow and disconnecting clients) and round three's (issue 56:
# batches, pins with hang-ups, deep states, h2 and h1 clients that never read, stalled bodies), every client
# under one of two API keys (a, b), each with its share of a 256 MiB pin budget.
#
# usage: bash tools/conformance/soak_adapters.sh KEV_BIN [DURATION_S=600] [RSS_ALLOWANCE_MIB=600]
# (the RSS allowance covers the 256 MiB cache, the 256 MiB pin budget and the work in flight)
set -euo pipefail
KEV=$1; DUR=${2:-600}; RSS=${3:-600}
cd "$(dirname "$0")/../.."
M=fixtures/mini
KEYFILE=$(mktemp); echo sk-soak-admin > "$KEYFILE"
KEYS=$(mktemp); echo '{"keys": [{"name": "a", "key": "sk-soak-a"}, {"name": "b", "key": "sk-soak-b"}]}' > "$KEYS"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
KEV_LOG=warn $KEV serve --port $PORT --base $M/base --adapter kev=$M/kev --adapter support=$M/adapters/support \
  --admin-key-file "$KEYFILE" --api-keys "$KEYS" --cache-bytes 268435456 --pin-bytes 268435456 2> >(tail -50 > "$KEYFILE.log") &
SPID=$!
for i in $(seq 1 300); do curl -sf http://127.0.0.1:$PORT/ready >/dev/null && break; sleep 1; done
set +e
python3 tools/conformance/soak.py http://127.0.0.1:$PORT $SPID $DUR $RSS --admin-key sk-soak-admin \
  --churn ops=$PWD/$M/adapters/ops --steady support --steady kev --key a=sk-soak-a --key b=sk-soak-b
RC=$?
kill $SPID; wait $SPID || true
rm -f "$KEYFILE" "$KEYFILE.log" "$KEYS"
exit $RC
