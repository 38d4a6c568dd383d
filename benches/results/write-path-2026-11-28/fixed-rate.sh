#!/bin/bash
# fixrate.sh BIN LABEL RATE: open-loop patch load on a fresh 3-node cluster; prints the bench's patch line and server CPU/update
BIN=$1; L=$2; R=$3
D=/tmp/fr-$L; rm -rf $D
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-16} --dir $D $UPOPTS >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/" | tr '\n' ' ')
timeout 300 ${CLIENT:-twinhub-bench} run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --rate $R --concurrency 64 --duration ${DUR:-30} --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!
sleep 8
c0=0; for p in $PIDS; do c0=$((c0+$(awk '{print $14+$15}' /proc/$p/stat))); done
sleep 15
c1=0; for p in $PIDS; do c1=$((c1+$(awk '{print $14+$15}' /proc/$p/stat))); done
wait $B
line=$(grep '^patch' $D/run.txt)
echo "$L $line cpu_ms_per_update=$(python3 -c "print(round(($c1-$c0)*10/15/$R,3))")"
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
