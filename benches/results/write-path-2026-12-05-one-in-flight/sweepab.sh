#!/bin/bash
# sweepab.sh OUT N K...: interleaved half-load sweeps with proposals_in_flight=K
OUT=$1; N=$2; shift 2; B=/work/main/target/release; mkdir -p $OUT
for i in $(seq 1 $N); do for k in "$@"; do
  TWINHUB_BENCH_NODE_OPTIONS=proposals_in_flight=$k $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 20 --out $OUT/sw$k-$i.json > $OUT/sw$k-$i.txt 2>/dev/null
  echo "pif=$k $i $(tr '\n' ' ' < $OUT/sw$k-$i.txt | tail -c 600)"
done; done
