#!/usr/bin/env bash
# A release build of twinhub optimised with a profile of its own write path (profile-guided optimisation).
#
#   scripts/build-pgo.sh            -> target/pgo/release/twinhub
#
# 1. builds an instrumented twinhub (target/pgo/gen) and the load generator (target/release/twinhub-bench);
# 2. runs it as a 3-node cluster under two loads, so that the profile holds the paths a fleet uses:
#    the closed-loop PATCH load of `twinhub bench compare` (HTTPS back ends, Raft, storage, change feed) and
#    the fleet mix of `twinhub bench run` (MQTT devices with reported patches and desired pushes, HTTPS
#    patch/get/replace);
# 3. merges what the nodes wrote with llvm-profdata and builds target/pgo/release/twinhub with it.
#
# The code and every guarantee are those of `cargo build --release`; only the compiler's layout and
# inlining decisions follow the profile (benches/README.md has both builds measured). Takes about 20
# minutes on 2 cores once the load generator is built (two builds of the server and a minute of load).
# Needs `llvm-profdata` that reads the raw profiles of rustc's LLVM: rustup's `llvm-tools` component when
# it is installed, otherwise a Debian `llvm-NN` package (installed here with apt-get when none is found;
# llvm-19's reads the profiles of rustc 1.95).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PGO=$ROOT/target/pgo
DATA=$PGO/data
say() { echo "build-pgo: $*" >&2; }

profdata() {
    local p
    p=$(ls "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -n 1 || true)
    [ -n "$p" ] && { echo "$p"; return 0; }
    for v in $(seq 30 -1 19); do
        p=$(command -v "llvm-profdata-$v" || true)
        [ -n "$p" ] && { echo "$p"; return 0; }
    done
    # An unversioned one only if it is LLVM 19 or later: older ones cannot read rustc's raw profiles
    # ("unsupported instrumentation profile format version").
    p=$(command -v llvm-profdata || true)
    if [ -n "$p" ]; then
        local major
        major=$("$p" merge --version 2>/dev/null | sed -n 's/.*LLVM version \([0-9]*\).*/\1/p' | head -n 1)
        [ "${major:-0}" -ge 19 ] && { echo "$p"; return 0; }
    fi
    return 1
}

PROFDATA=$(profdata || true)
if [ -z "$PROFDATA" ] && command -v apt-get >/dev/null; then
    say "no llvm-profdata found: apt-get install llvm-19"
    apt-get install -y -q llvm-19 >&2
    PROFDATA=$(profdata || true)
fi
[ -n "$PROFDATA" ] || { say "llvm-profdata not found (rustup component add llvm-tools, or install llvm)"; exit 2; }
say "using $PROFDATA"

say "1/4 the load generator (cargo build --release -p twinhub-bench)"
cargo build --release -p twinhub-bench
BENCH=$ROOT/target/release/twinhub-bench

say "2/4 the instrumented server (target/pgo/gen)"
rm -rf "$DATA"
mkdir -p "$DATA"
RUSTFLAGS="-Cprofile-generate=$DATA" cargo build --release -p twinhub --target-dir "$PGO/gen"
INSTRUMENTED=$PGO/gen/release/twinhub
# RUSTFLAGS instrumented the build scripts and proc macros too, and they ran during the build: their
# profiles are not the server's.
rm -f "$DATA"/*.profraw

say "3/4 training: closed-loop PATCH load, 20 s (progress below)"
"$BENCH" compare --bin "$INSTRUMENTED" --systems twinhub --duration 20 --concurrency 64 --twins 10000 \
    --value-bytes 200 --out "$PGO/train-compare.json" >"$PGO/train-compare.txt"
say "3/4 training: fleet mix, 200 MQTT devices (TLS) and 16 back ends, 20 s"
"$BENCH" run --bin "$INSTRUMENTED" --devices 200 --twins 2000 --mqtt-tls --reported-rate 2 --concurrency 16 \
    --mix patch=70,get=20,replace=10 --value-bytes 100-2000 --duration 20 \
    --out "$PGO/train-run.json" >"$PGO/train-run.txt"
ls "$DATA"/*.profraw >/dev/null 2>&1 || { say "the nodes wrote no profile to $DATA"; exit 1; }
"$PROFDATA" merge -o "$PGO/merged.profdata" "$DATA"/*.profraw

say "4/4 the optimised server (target/pgo/release)"
RUSTFLAGS="-Cprofile-use=$PGO/merged.profdata" cargo build --release -p twinhub --target-dir "$PGO"
say "wrote $PGO/release/twinhub (run the benches with it: TWINHUB_BIN=$PGO/release/twinhub or --bin)"
