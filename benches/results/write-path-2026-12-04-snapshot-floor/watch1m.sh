#!/bin/bash
# watch1m.sh BINDIR LABEL: 1M-twin compare; per-second timestamped bench lines and per-node snapshot/fsync metrics
B=$1; L=$2; O=/tmp/m1
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 1000000 --value-bytes 200 --out $O/w-$L.json > $O/w-$L.txt 2> >(while IFS= read -r l; do echo "$(date +%s.%N | cut -c1-14) $l"; done > $O/w-$L.err) &
P=$!
until grep -q "closed loop" $O/w-$L.err 2>/dev/null; do kill -0 $P 2>/dev/null || break; sleep 0.5; done
D=$(ps -eo args | grep "$B/twinhub serve" | grep -v grep | head -1 | sed 's/.*--config \(.*\)\/node-1.*/\1/')
ports=$(for n in 1 2 3; do grep http_listen $D/node-$n/twinhub.toml | sed 's/.*:\([0-9]*\)"/\1/'; done)
: > $O/w-$L.metrics
for i in $(seq 1 40); do
  t=$(date +%s.%N | cut -c1-14); n=0
  for p in $ports; do n=$((n+1)); curl -sk https://127.0.0.1:$p/metrics | grep -E "^twinhub_snapshot_encode_seconds_(count|sum)|^twinhub_twin_actors|^twinhub_storage_fsync_seconds_(count|sum)|^twinhub_raft_leader|compaction|flush" | sed "s/^/$t n$n /" >> $O/w-$L.metrics; done
  sleep 1
done
wait $P
grep -E "^twinhub " $O/w-$L.txt
