#!/bin/bash
# shardab.sh BINDIR OUT N SHARDS K...: interleaved twinhub-only closed loops (20 s) at --shard-count SHARDS, proposals_in_flight=K
B=$1; OUT=$2; N=$3; S=$4; shift 4; mkdir -p $OUT
for i in $(seq 1 $N); do for k in "$@"; do
  TWINHUB_BENCH_NODE_OPTIONS=proposals_in_flight=$k $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --shard-count $S --duration 20 --concurrency 64 --twins 10000 --value-bytes 200 --out $OUT/s$S-pif$k-$i.json > $OUT/s$S-pif$k-$i.txt 2>/dev/null
  echo "shards=$S pif=$k $i $(grep -E '^twinhub ' $OUT/s$S-pif$k-$i.txt)"
done; done
