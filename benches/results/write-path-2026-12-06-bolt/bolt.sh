#!/usr/bin/env bash
# bolt.sh: the profile-guided build laid out again by BOLT (LLVM's post-link optimiser), as measured in
# benches/README.md (2026-12-06). Run from the repository after `scripts/build-pgo.sh` (it reuses that
# script's target/pgo/merged.profdata and the load generator in target/release):
#   1. rebuilds target/pgo/release/twinhub from the same profile, keeping relocations (--emit-relocs),
#      which BOLT needs to move functions; the code is the same;
#   2. instruments a copy with llvm-bolt, runs build-pgo.sh's two training loads against it (each node
#      writes its own profile when it exits), merges the profiles (merge-fdata);
#   3. writes target/pgo/bolt/twinhub (blocks and functions reordered, cold code split out) and
#      target/pgo/bolt/twinhub-hugify (the same, with its hot text copied onto huge pages at start).
# Needs Debian's bolt-19 (apt-get install bolt-19). llvm-bolt looks for its instrumentation runtime in
# ../lib beside the path it was started by, so it is started from /usr/lib/llvm-19/bin, not the symlink.
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
PGO=$ROOT/target/pgo; BENCH=$ROOT/target/release/twinhub-bench; BDIR=$PGO/bolt
LLVM_BOLT=$(readlink -f "$(command -v llvm-bolt-19)"); MERGE_FDATA=$(command -v merge-fdata-19)
say() { echo "bolt: $*" >&2; }
train() {
    say "training ($2): closed-loop PATCH load, 20 s"
    "$BENCH" compare --bin "$1" --systems twinhub --duration 20 --concurrency 64 --twins 10000 \
        --value-bytes 200 --out "$PGO/$2-compare.json" >"$PGO/$2-compare.txt"
    say "training ($2): fleet mix, 200 MQTT devices (TLS) and 16 back ends, 20 s"
    "$BENCH" run --bin "$1" --devices 200 --twins 2000 --mqtt-tls --reported-rate 2 --concurrency 16 \
        --mix patch=70,get=20,replace=10 --value-bytes 100-2000 --duration 20 \
        --out "$PGO/$2-run.json" >"$PGO/$2-run.txt"
}
say "1/3 the PGO build with relocations"
RUSTFLAGS="-Cprofile-use=$PGO/merged.profdata -Clink-arg=-Wl,--emit-relocs" cargo build --release -p twinhub --target-dir "$PGO"
say "2/3 instrumented copy and training"
rm -rf "$BDIR"; mkdir -p "$BDIR/data"
"$LLVM_BOLT" "$PGO/release/twinhub" -o "$BDIR/twinhub-instrumented" -instrument \
    -instrumentation-file="$BDIR/data/prof" -instrumentation-file-append-pid >"$BDIR/instrument.log" 2>&1
train "$BDIR/twinhub-instrumented" bolt-train
"$MERGE_FDATA" "$BDIR"/data/prof.* >"$BDIR/merged.fdata" 2>"$BDIR/merge.log"
say "3/3 the optimised layouts"
for variant in "" -hugify; do
    "$LLVM_BOLT" "$PGO/release/twinhub" -o "$BDIR/twinhub$variant" -data="$BDIR/merged.fdata" \
        -reorder-blocks=ext-tsp -reorder-functions=cdsort -split-functions -split-all-cold -split-eh \
        ${variant:+-hugify} -dyno-stats >"$BDIR/optimise$variant.log" 2>&1
done
rm -f "$BDIR/twinhub-instrumented"
say "wrote $BDIR/twinhub and $BDIR/twinhub-hugify"
