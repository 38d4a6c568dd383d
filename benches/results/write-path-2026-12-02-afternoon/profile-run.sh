#!/bin/bash
# profile-run.sh BUILD_DIR LABEL: a twinhub-only compare of [C=N] workers, else 64 ([SC=N]: at N shards, else the default); perf (DWARF, [HZ=N] Hz, else 149) on the 3 nodes ([ON=bench]: on the load generator instead) for 8 s of its window; folded stacks in /tmp/prof-LABEL/folded.gz
BD=$1; L=$2; W=/tmp/prof-$L; rm -rf $W; mkdir -p $W
TWINHUB_BIN=$BD/twinhub $BD/twinhub bench compare --systems twinhub --duration 30 --concurrency ${C:-64} --twins 10000 --value-bytes 200 ${SC:+--shard-count $SC} --out $W/c.json > $W/c.txt 2> $W/c.log &
B=$!
until grep -q "closed loop" $W/c.log 2>/dev/null; do kill -0 $B 2>/dev/null || { tail $W/c.log; exit 1; }; sleep 1; done
sleep 10
if [ "${ON:-nodes}" = bench ]; then PIDS=$(pgrep -f "twinhub-bench compare" | paste -sd, -); else PIDS=$(pgrep -f "$BD/twinhub serve" | paste -sd, -); fi
perf record -F ${HZ:-149} --call-graph dwarf,16384 -p "$PIDS" -o $W/perf.data -- sleep 8 2>/dev/null >/dev/null
wait $B
perf script -i $W/perf.data 2>/dev/null | python3 "$(dirname "$0")/../write-path-2026-12-01-events/fold.py" | gzip > $W/folded.gz
grep -E '^twinhub ' $W/c.txt
