#!/bin/bash
# pairs.sh N BIN_A BIN_B: N interleaved half-load runs of each build (sweep50.sh, 90 s at 50 %), each on a
# fresh 3-node cluster; after each run, the log keyspace's size on disk per node and the nodes' storage
# write histogram (rounds under 10 ms, under 25 ms, all).
#   CLIENT=twinhub-bench pairs.sh 3 A/twinhub B/twinhub
HERE=$(cd "$(dirname "$0")" && pwd); SWEEP=$HERE/../write-path-2026-11-29-night/sweep50.sh
for i in $(seq 1 ${1:-3}); do
  for side in A B; do
    bin=$2; [ $side = B ] && bin=$3
    DUR=90 bash "$SWEEP" "$bin" pf-$side$i
    echo "log keyspace MB per node: $(du -sm /tmp/sw-pf-$side$i/node-*/data/raft/keyspaces/1 2>/dev/null | awk '{printf "%s ", $1}')"
    grep -h '^twinhub_storage_write_seconds_bucket{le="0.01"}\|^twinhub_storage_write_seconds_count\|^twinhub_storage_write_seconds_bucket{le="0.025"}' /tmp/sw-pf-$side$i/metrics.txt | tr '\n' ' '; echo
  done
done
