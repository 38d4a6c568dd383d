#!/usr/bin/env bash
# twinhub's test command (README "Test it"; CI runs exactly this through .ci/run).
#
#   1. makes sure Python 3.11 and a venv in .venv with azure-iot-hub 2.7.0 (+ six, pytest) exist,
#   2. cargo build            (the debug `twinhub` binary the tests start),
#   3. cargo test             (unit tests + integration tests against the real binary),
#   4. pytest                 (the official Python service SDK against the real binary).
# Fails if any part fails. Works on a fresh machine; installs only what is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf 'test.sh: %s\n' "$*" >&2; exit 1; }

VENV=.venv
PY_PKGS=(azure-iot-hub==2.7.0 six pytest)

is_py311() { "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' >/dev/null 2>&1; }

find_python() {
  for c in "${PYTHON:-}" python3.11 python3; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && is_py311 "$c"; then command -v "$c"; return 0; fi
  done
  return 1
}

apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "need to install $* but apt-get is not available"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  step "apt-get install $*"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"
}

step "Python environment ($VENV)"
command -v cargo >/dev/null 2>&1 || die "cargo not found: install the Rust toolchain first"
if ! [ -x "$VENV/bin/python" ] || ! is_py311 "$VENV/bin/python" \
   || ! "$VENV/bin/python" -c 'import azure.iot.hub, pytest' >/dev/null 2>&1; then
  PY=$(find_python) || { apt_install python3.11 python3.11-venv; PY=$(find_python) || die "no Python 3.11 after install"; }
  echo "using $PY ($("$PY" --version))"
  rm -rf "$VENV"
  if ! "$PY" -m venv "$VENV"; then
    rm -rf "$VENV"
    apt_install python3.11-venv
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  # uamqp is a native dependency of azure-iot-hub: insist on its prebuilt wheel (no source build).
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary uamqp "${PY_PKGS[@]}"
fi
"$VENV/bin/python" -c 'import azure.iot.hub, uamqp, six, pytest; from importlib.metadata import version; print("azure-iot-hub", version("azure-iot-hub"), "| uamqp", version("uamqp"), "| pytest", version("pytest"))' \
  || die "the Python SDK does not import from $VENV"

step "cargo build"
cargo build 2>&1

failed=()

step "cargo test (unit + integration against the real binary)"
cargo test --no-fail-fast 2>&1 || failed+=("cargo test")

step "pytest: official azure-iot-hub service SDK against the real binary"
TWINHUB_BIN="$PWD/target/debug/twinhub" "$VENV/bin/python" -m pytest -v -p no:cacheprovider tests/python \
  || failed+=("pytest")

if [ ${#failed[@]} -gt 0 ]; then
  step "FAILED: ${failed[*]}"
  exit 1
fi
step "all tests passed"
