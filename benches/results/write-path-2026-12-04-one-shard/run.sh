#!/bin/bash
# run.sh BINDIR OUT LABEL SHARDS: twinhub-only compare at SHARDS shards; per-node CPU over 15 s of the window
B=$1; O=$2; L=$3; S=$4; mkdir -p $O
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --shard-count $S --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/$L.json > $O/$L.txt 2> $O/$L.err &
P=$!
until grep -q "closed loop" $O/$L.err 2>/dev/null; do kill -0 $P 2>/dev/null || break; sleep 0.5; done
sleep 8
PIDS=$(pgrep -f "$B/twinhub serve")
declare -A a
for p in $PIDS; do a[$p]=$(awk '{print $14+$15}' /proc/$p/stat); done
sleep 15
for p in $PIDS; do b=$(awk '{print $14+$15}' /proc/$p/stat); echo "$L pid $p cores $(echo "scale=3; ($b-${a[$p]})/100/15" | bc)"; done > $O/$L.nodes
wait $P
grep -A1 "^system" $O/$L.txt | tail -1 | sed "s/^/$L /"; cat $O/$L.nodes
