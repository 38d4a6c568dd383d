#!/bin/bash
# Closed-loop PATCH load on a fresh 3-node cluster of BIN, one line of results.
# usage: closed-loop.sh BIN LABEL [node-option ...]
#   CLIENT (default twinhub-bench): the load generator, the same for both builds of an A/B
#   SC (default 16): shards; DUR (default 20): measured seconds
# Prints the bench's patch line, the server CPU per update (the three nodes' /proc CPU time over 10 s
# of the run, divided by the run's rate) and node 1's group-commit fsync time and rate.
BIN=$1; L=$2; shift 2
D=/tmp/cl-$L; rm -rf $D
OPTS=""; for o in "$@"; do OPTS="$OPTS --node-option $o"; done
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-16} --dir $D $OPTS >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/" | tr '\n' ' ')
timeout 300 ${CLIENT:-twinhub-bench} run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 --duration ${DUR:-20} --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!
sleep 12
H1=$(python3 -c "import json;print(json.load(open('$D/cluster.json'))['nodes'][0]['http'])")
m0=$(curl -sk https://$H1/metrics | grep -E '^twinhub_storage_fsync_seconds_(sum|count)' | awk '{print $2}' | paste -sd' ')
c0=0; for p in $PIDS; do c0=$((c0+$(awk '{print $14+$15}' /proc/$p/stat))); done
sleep 10
c1=0; for p in $PIDS; do c1=$((c1+$(awk '{print $14+$15}' /proc/$p/stat))); done
m1=$(curl -sk https://$H1/metrics | grep -E '^twinhub_storage_fsync_seconds_(sum|count)' | awk '{print $2}' | paste -sd' ')
wait $B
line=$(grep '^patch' $D/run.txt)
rate=$(echo $line | awk '{print $4}')
echo "$L $line cpu_ms_per_update=$(python3 -c "print(round(($c1-$c0)*10/10/$rate,3))") node1_fsync=$(python3 -c "
a='$m0'.split(); b='$m1'.split()
s0,n0=float(a[0]),float(a[1]); s1,n1=float(b[0]),float(b[1])
print(f'{(s1-s0)/max(n1-n0,1)*1000:.3f}ms x {(n1-n0)/10:.0f}/s')" 2>/dev/null)"
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
