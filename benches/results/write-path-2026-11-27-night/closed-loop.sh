#!/bin/bash
# usage: cl.sh BIN LABEL [node-option ...] : 3-node cluster, closed loop patch 64 conns 20 s, prints ops/s p50 p99 and server CPU ms/update
BIN=$1; L=$2; shift 2
D=/tmp/cl-$L; rm -rf $D
OPTS=""; for o in "$@"; do OPTS="$OPTS --node-option $o"; done
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-16} --dir $D $OPTS >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/" | tr '\n' ' ')
timeout 300 /tmp/h9/twinhub-bench run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 --duration ${DUR:-20} --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!
sleep 12
c0=0; for p in $PIDS; do c0=$((c0+$(awk '{print $14+$15}' /proc/$p/stat))); done
sleep 10
c1=0; for p in $PIDS; do c1=$((c1+$(awk '{print $14+$15}' /proc/$p/stat))); done
ops=$(grep -c . /dev/null)
wait $B
line=$(grep '^patch' $D/run.txt)
rate=$(echo $line | awk '{print $4}')
echo "$L $line cpu_ms_per_update=$(python3 -c "print(round(($c1-$c0)*10/10/$rate,3))")"
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
