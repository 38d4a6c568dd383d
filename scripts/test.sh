#!/usr/bin/env bash
# twinhub's test command (README "Test it"; CI runs exactly this through .ci/run).
#
#   1. makes sure Python 3.11 and a venv in .venv with azure-iot-hub 2.7.0 (+ six, pytest, cryptography for test certificates,
#      selenium for the console's browser test, with Debian's chromium and chromium-driver) and
#      azure-iot-device 2.14.0 exist (a missing package is pip-installed into an existing venv),
#   2. cargo build --all-targets with clippy as the workspace's compiler, -D warnings (the lint and the
#      build in one pass: the debug programs the tests start, and the tests themselves, with the tests'
#      features, so that step 3 compiles nothing again), linked with mold when it can be installed,
#   3. cargo test             (unit tests + integration tests against the real binary),
#   4. fuzz smoke             (every network parser, 20 s of mutated inputs each: tests/fuzz_smoke.rs),
#   5. pytest                 (the official Python service and device SDKs against the real binary).
# Fails if any part fails. Works on a fresh machine; installs only what is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf 'test.sh: %s\n' "$*" >&2; exit 1; }

VENV=.venv
PY_PKGS=(azure-iot-hub==2.7.0 six pytest azure-iot-device==2.14.0 cryptography selenium)
# What each package must import as (same order as PY_PKGS), and the exact versions the suites are written for.
PY_IMPORTS=(azure.iot.hub six pytest azure.iot.device cryptography selenium)
PY_PINNED=(azure-iot-hub==2.7.0 azure-iot-device==2.14.0)

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
pip_install() {
  # uamqp is a native dependency of azure-iot-hub: insist on its prebuilt wheel (no source build).
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary uamqp "$@"
}
if ! [ -x "$VENV/bin/python" ] || ! is_py311 "$VENV/bin/python" \
   || ! "$VENV/bin/python" -c 'import pip' >/dev/null 2>&1; then
  PY=$(find_python) || { apt_install python3.11 python3.11-venv; PY=$(find_python) || die "no Python 3.11 after install"; }
  echo "using $PY ($("$PY" --version))"
  rm -rf "$VENV"
  if ! "$PY" -m venv "$VENV"; then
    rm -rf "$VENV"
    apt_install python3.11-venv
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  pip_install "${PY_PKGS[@]}"
fi
# An existing venv may lack a package (or hold another version of a pinned SDK): install only what is missing.
missing=()
for i in "${!PY_PKGS[@]}"; do
  if ! "$VENV/bin/python" -c "import ${PY_IMPORTS[$i]}" >/dev/null 2>&1; then missing+=("${PY_PKGS[$i]}"); fi
done
for spec in "${PY_PINNED[@]}"; do
  if ! "$VENV/bin/python" -c 'import sys; from importlib.metadata import version; n, v = sys.argv[1].split("=="); sys.exit(0 if version(n) == v else 1)' "$spec" >/dev/null 2>&1 \
     && ! printf '%s\n' "${missing[@]}" | grep -qxF "$spec"; then
    missing+=("$spec")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing into $VENV: ${missing[*]}"
  pip_install "${missing[@]}"
fi
# The device-SDK suite severs device connections with `ss -K` (iproute2); the chaos suite cuts links
# between network namespaces with iptables.
command -v ss >/dev/null 2>&1 || apt_install iproute2
command -v iptables >/dev/null 2>&1 || apt_install iptables
# tests/dashboards.rs checks the Prometheus rules and scrape config with promtool.
command -v promtool >/dev/null 2>&1 || apt_install prometheus
# The chaos suite's power-loss file system mounts through FUSE (fusermount3 from Debian's fuse3).
command -v fusermount3 >/dev/null 2>&1 || apt_install fuse3
# tests/cluster_tls.rs captures the cluster ports with tcpdump to show no twin JSON crosses them in clear.
command -v tcpdump >/dev/null 2>&1 || apt_install tcpdump
# mold links the few dozen test programs in a fraction of GNU ld's time. Only a speed-up: without it
# (no apt, no package) the build links as usual.
command -v mold >/dev/null 2>&1 || (apt_install mold) || echo "test.sh: mold not installed; linking with the default linker"
LINK=()
command -v mold >/dev/null 2>&1 && LINK=(mold -run)
# tests/python/test_console.py drives the web console in headless Chromium over WebDriver (Selenium);
# Debian's chromium-driver matches its chromium exactly, so nothing is downloaded at test time.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  apt_install chromium chromium-driver
fi
"$VENV/bin/python" -c 'import azure.iot.hub, azure.iot.device, uamqp, six, pytest; from importlib.metadata import version; print("azure-iot-hub", version("azure-iot-hub"), "| azure-iot-device", version("azure-iot-device"), "| uamqp", version("uamqp"), "| pytest", version("pytest"))' \
  || die "the Python SDKs do not import from $VENV"

failed=()

step "cargo fmt --check (rustfmt.toml)"
if command -v rustfmt >/dev/null 2>&1 || rustup component add rustfmt >/dev/null 2>&1; then
  if ! cargo fmt --check >/dev/null 2>&1; then
    cargo fmt --check 2>&1 | head -40
    failed+=("cargo fmt --check (run cargo fmt)")
  fi
else
  failed+=("cargo fmt (rustfmt missing: rustup component add rustfmt)")
fi

step "cargo clippy --all-targets -- -D warnings, in the build: cargo build --all-targets"
# `cargo clippy` is `cargo check` with clippy-driver compiling the workspace's own crates; a separate
# check pass compiles every dependency a second time, in check mode, which was a quarter of a cold CI
# run. Here clippy-driver is the workspace's compiler in the one build the tests use: it lints with the
# same lints and `-D warnings`, and also generates code. The build compiles every target at once, with
# the features the tests unify in (the dev-dependencies'): a plain `cargo build` resolves features
# without them, and `cargo test` would then compile the crates whose features differ a second time.
# Every later cargo command runs with the same two variables (they are part of cargo's fingerprint).
if clippy-driver --version >/dev/null 2>&1 || rustup component add clippy >/dev/null 2>&1; then
  export RUSTC_WORKSPACE_WRAPPER
  RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver)"
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
  if ! "${LINK[@]}" cargo build --all-targets 2>&1; then
    # A lint or a compile error: say which, and still build for the tests when it was only a lint.
    failed+=("cargo clippy --all-targets -- -D warnings (or the build)")
    unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
    "${LINK[@]}" cargo build --all-targets 2>&1
  fi
else
  failed+=("cargo clippy (clippy missing: rustup component add clippy)")
  "${LINK[@]}" cargo build --all-targets 2>&1
fi

step "cargo test (unit + integration against the real binary)"
# The fuzz smoke tests get their own step and budget below.
# The output is kept too: on failure, the summary at the very end repeats which tests failed and how,
# so that the tail of a long run is enough to tell.
mkdir -p target
set +o pipefail
cargo test --no-fail-fast -- --skip fuzz_smoke_ 2>&1 | tee target/cargo-test.log
test_status=${PIPESTATUS[0]}
set -o pipefail
[ "$test_status" -eq 0 ] || failed+=("cargo test")

# Stable Rust, no instrumentation: a cold libFuzzer build of the server takes ~8 minutes here, so CI
# runs the mutation driver instead (fuzz/README.md). A crash fails the run and leaves the input in
# target/fuzz-smoke/. FUZZ_SMOKE_SECS and FUZZ_SMOKE_SEED override budget and seed.
step "fuzz smoke: every network parser, ${FUZZ_SMOKE_SECS:-20} s of mutated seed inputs each (fuzz/README.md)"
FUZZ_SMOKE_SECS="${FUZZ_SMOKE_SECS:-20}" cargo test --test fuzz_smoke -- --nocapture 2>&1 || failed+=("fuzz smoke")

step "pytest: official azure-iot-hub service SDK and azure-iot-device device SDK against the real binary"
TWINHUB_BIN="$PWD/target/debug/twinhub" "$VENV/bin/python" -m pytest -v -p no:cacheprovider tests/python \
  || failed+=("pytest")

step "chaos suite, short profile (every scenario once against a 3-node cluster in network namespaces)"
if [ "$(id -u)" -ne 0 ]; then
  echo "the chaos suite needs root (network namespaces, iptables, tmpfs mounts)"
  failed+=("chaos (not root)")
else
  rm -rf target/chaos-short
  target/debug/twinhub chaos --profile short --dir target/chaos-short 2>&1 || failed+=("chaos (see target/chaos-short/summary.txt)")
fi

if [ ${#failed[@]} -gt 0 ]; then
  if [ "${test_status:-0}" -ne 0 ] && [ -f target/cargo-test.log ]; then
    step "cargo test failures (from target/cargo-test.log)"
    # Each failed test's own output, cut to its first lines, then the failing test binaries.
    awk '/^---- .* stdout ----$/ { n = 0; show = 1 } /^failures:$/ { show = 0 }
         show && n < 30 { print; n++ }' target/cargo-test.log | head -200
    grep -E '^test .* FAILED$|^error: test failed|^error: [0-9]+ targets? failed' target/cargo-test.log | head -40
  fi
  step "FAILED: ${failed[*]}"
  exit 1
fi
step "all tests passed"
