#!/bin/bash
# One latency sweep on a fresh 3-node, 8-shard cluster whose logs are kept, then the AppendEntries
# timeouts its nodes logged: heartbeats (openraft's heartbeat worker) and replication streams.
#   [CLIENT=twinhub-bench] sweep-run.sh BIN LABEL OUT_PREFIX     → OUT_PREFIX.{json,svg,txt}, logs in /tmp/sw-LABEL
BIN=$1; L=$2; OUT=$3
D=/tmp/sw-$L; rm -rf $D
timeout 60 $BIN cluster up --nodes 3 --shard-count 8 --dir $D >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
timeout 900 ${CLIENT:-twinhub-bench} latency-sweep --cluster $D/cluster.json --duration 20 --out $OUT.json > $OUT.txt 2>$D/sweep.log
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
hb=$(cat $D/node-*/twinhub.log | grep -c "failed to send a heartbeat.*Timeout")
rep=$(cat $D/node-*/twinhub.log | grep -c "ReplicationCore recv RPCError: timeout.*stream-replication")
echo "$L: AppendEntries timeouts logged: $rep replication, $hb heartbeat" | tee -a $OUT.txt
