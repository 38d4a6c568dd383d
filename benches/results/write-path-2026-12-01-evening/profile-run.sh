#!/bin/bash
# twinhub-only compare; perf record of the 3 nodes for 8 s of the window.
BD=$1; L=$2
W=/tmp/prof-$L; rm -rf $W; mkdir -p $W
TWINHUB_BIN=$BD/twinhub $BD/twinhub bench compare --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/c.json > $W/c.txt 2> $W/c.log &
B=$!
until grep -q "closed loop" $W/c.log 2>/dev/null; do kill -0 $B 2>/dev/null || { tail $W/c.log; exit 1; }; sleep 1; done
sleep 8
PIDS=$(pgrep -f "$BD/twinhub serve" | paste -sd,)
perf record -F 199 --call-graph dwarf,16384 -p $PIDS -o $W/perf.data -- sleep 8 >/dev/null 2>&1
wait $B
grep -E '^twinhub ' $W/c.txt
