#!/usr/bin/env bash
# A flame graph of the three twinhub nodes under the write benchmark's closed-loop PATCH load.
#
#   scripts/flamegraph.sh [OUT.svg] [SECONDS]      (default: target/flame-write-path.svg, 10 s)
#
# Builds the release binary (it carries debug info, so DWARF call stacks resolve), starts
# `twinhub bench compare --systems twinhub`, waits until the measured window runs, samples every server
# process with `perf record --call-graph dwarf` at 149 Hz, and renders the stacks with inferno (installed
# with `cargo install inferno` if missing; functions under 0.2 % are left out of the SVG, the folded
# stacks beside it keep everything). Needs root or kernel.perf_event_paranoid <= 1.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/flame-write-path.svg}
SECS=${2:-10}
command -v perf >/dev/null || { echo "perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
command -v inferno-flamegraph >/dev/null || cargo install inferno --locked
cargo build --release -p twinhub -p twinhub-bench   # the server and the load generator `twinhub bench` runs
BIN=$PWD/target/release/twinhub
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "flamegraph: starting the write benchmark (log: $WORK/bench.log)" >&2
TWINHUB_BIN=$BIN "$BIN" bench compare --systems twinhub --duration $((SECS + 30)) --warmup 5 \
    --concurrency 64 --twins 10000 --value-bytes 200 --out "$WORK/bench.json" >"$WORK/bench.txt" 2>"$WORK/bench.log" &
BENCH=$!
until grep -q "closed loop" "$WORK/bench.log" 2>/dev/null; do
    kill -0 $BENCH 2>/dev/null || { cat "$WORK/bench.log" >&2; exit 1; }
    sleep 1
done
sleep 10   # past the warm-up
PIDS=$(pgrep -f "$BIN serve" | paste -sd, -)
echo "flamegraph: sampling server processes $PIDS for ${SECS}s" >&2
perf record -F 149 --call-graph dwarf,16384 -p "$PIDS" -o "$WORK/perf.data" -- sleep "$SECS" >&2
echo "flamegraph: folding stacks (takes a minute)" >&2
perf script -i "$WORK/perf.data" 2>/dev/null | inferno-collapse-perf >"$WORK/folded.txt"
mkdir -p "$(dirname "$OUT")"
inferno-flamegraph --minwidth 0.2 --title "twinhub write path: 3 nodes, closed-loop PATCH" <"$WORK/folded.txt" >"$OUT"
gzip -c "$WORK/folded.txt" >"${OUT%.svg}.folded.gz"
wait $BENCH || true
grep -E "^twinhub" "$WORK/bench.txt" >&2 || true
echo "flamegraph: wrote $OUT and ${OUT%.svg}.folded.gz (render it again: zcat F | inferno-flamegraph)" >&2
