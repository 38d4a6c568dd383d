#!/bin/bash
# fault-record.sh BINDIR OUT: a twinhub-only closed-loop compare; every 4th page fault of the three nodes
# with its call stack (perf, DWARF) for 20 s of the window, folded into OUT/folded.gz
B=$1; W=$2; mkdir -p $W
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/c.json > $W/c.txt 2> $W/c.log &
P=$!
until grep -q "closed loop" $W/c.log 2>/dev/null; do kill -0 $P 2>/dev/null || exit 1; sleep 1; done
sleep 5
perf record -e page-faults -c 4 --call-graph dwarf,16384 -p "$(pgrep -f "$B/twinhub serve" | paste -sd, -)" -o $W/perf.data -- sleep 20
wait $P
perf script -i $W/perf.data 2>/dev/null | python3 "$(dirname "$0")/../write-path-2026-12-01-events/fold.py" | gzip > $W/folded.gz
