#!/usr/bin/env bash
# The Python package's tests (python/tests): builds `kev` from source into a venv under target/ exactly as
# a user would (`pip install ./python`, maturin from PyPI as the PEP 517 backend, only the Rust toolchain
# needed), adds ray[serve,data], pytest and the official SDK, and checks kev.Model and the Ray Data example
# against the `kev` CLI, and kev.serve (Ray Serve, two replicas on one local Ray cluster) against `kev serve`.
#
# The wheel is built in the dev profile into the workspace's target/, so it reuses the engine that
# `cargo test` / `cargo build -p kev` compiled and is bit-for-bit the code of target/debug/kev, the CLI it
# is compared with. (A user's `pip install ./python` builds the release profile.)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
venv=${KEV_PY_VENV:-target/python-venv}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
export RAY_USAGE_STATS_ENABLED=0
start=$(date +%s)

step() { echo "== python: $*"; }
fail() { echo "python: $*" >&2; exit 1; }

# KEV_BIN: a kev binary already built from this tree in the dev profile (CI passes the test build's, so the
# CLI is not built a second time with another feature set).
if [ -n "${KEV_BIN:-}" ]; then
  step "kev CLI: $KEV_BIN"
  [ -x "$KEV_BIN" ] || fail "KEV_BIN=$KEV_BIN is not an executable"
else
  step "kev CLI (dev profile)"
  cargo build --locked -p kev || fail "cargo build -p kev failed"
  KEV_BIN="$CARGO_TARGET_DIR/debug/kev"
fi

step "venv $venv: ray[serve,data], pytest, typesafe-sdk"
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv" || fail "python3 -m venv failed"; fi
# ray pinned to the version kev.serve is tested with (its RequestRouter API is alpha: python/pyproject.toml).
"$venv/bin/pip" install -q --disable-pip-version-check "ray[serve,data]==2.60.0" "pytest==9.2.0" \
  "typesafe-sdk[zstd]==0.7.5" || fail "pip install ray[serve,data] pytest typesafe-sdk failed"

step "pip install ./python (built from source, dev profile)"
t0=$(date +%s)
MATURIN_PEP517_ARGS="--profile dev --locked" \
  "$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps ./python \
  || fail "pip install ./python failed"
echo "built and installed in $(( $(date +%s) - t0 )) s"
(cd /tmp && "$root/$venv/bin/python" -c "import kev; print('import kev', kev.__version__, 'from', kev.__file__)") \
  || fail "import kev failed"

step "pytest python/tests"
log=$(mktemp)
KEV_BIN="$KEV_BIN" "$venv/bin/python" -m pytest python/tests -q -rs -p no:cacheprovider 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
summary=$(grep -E '[0-9]+ (passed|failed|error)' "$log" | tail -n 1)
rm -f "$log"
echo "python: ${summary:-no pytest summary} (whole step $(( $(date +%s) - start )) s)"
case "$status" in
  0) exit 0 ;;
  5) fail "pytest collected no tests (exit 5): python/tests is missing or broken" ;;
  *) exit "$status" ;;
esac
