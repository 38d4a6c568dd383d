#!/bin/bash
# profile-client.sh BINDIR OUTDIR: a twinhub-only compare with perf (DWARF, 299 Hz) on the load generator
# itself (not the nodes) for 8 s of its window; folded stacks in OUTDIR/folded.gz.
BD=$1; W=$2; rm -rf "$W"; mkdir -p "$W"
FOLD="$(cd "$(dirname "$0")" && pwd)/../write-path-2026-12-01-events/fold.py"
"$BD/twinhub-bench" compare --bin "$BD/twinhub" --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out "$W/c.json" > "$W/c.txt" 2> "$W/c.log" &
B=$!
until grep -q "closed loop" "$W/c.log" 2>/dev/null; do kill -0 $B 2>/dev/null || { tail "$W/c.log"; exit 1; }; sleep 1; done
sleep 10
perf record -F 299 --call-graph dwarf,16384 -p "$B" -o "$W/perf.data" -- sleep 8 2>/dev/null >/dev/null
wait $B
perf script -i "$W/perf.data" 2>/dev/null | python3 "$FOLD" | gzip > "$W/folded.gz"
grep -E '^twinhub ' "$W/c.txt"
