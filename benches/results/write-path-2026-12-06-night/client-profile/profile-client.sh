#!/bin/bash
# profile-client.sh BUILD_DIR LABEL: perf (DWARF, [HZ=N] Hz, else 299) on the load generator (twinhub-bench) for 8 s of a twinhub-only compare; folded stacks in /tmp/prof-LABEL/folded.gz
BD=$1; L=$2; W=/tmp/prof-$L; rm -rf $W; mkdir -p $W
TWINHUB_BIN=$BD/twinhub $BD/twinhub bench compare --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/c.json > $W/c.txt 2> $W/c.log &
B=$!
until grep -q "closed loop" $W/c.log 2>/dev/null; do kill -0 $B 2>/dev/null || { tail $W/c.log; exit 1; }; sleep 1; done
sleep 10
PIDS=$(pgrep -f "twinhub-bench compare" | paste -sd, -)
echo "pids $PIDS"
perf record -F ${HZ:-299} --call-graph dwarf,16384 -p "$PIDS" -o $W/perf.data -- sleep 8 2>/dev/null >/dev/null
wait $B
perf script -i $W/perf.data 2>/dev/null | python3 "$(dirname "$0")/../../write-path-2026-12-01-events/fold.py" | gzip > $W/folded.gz
grep -E '^twinhub ' $W/c.txt
