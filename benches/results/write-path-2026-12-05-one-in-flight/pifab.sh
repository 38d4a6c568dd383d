#!/bin/bash
# pifab.sh OUT N K...: interleaved twinhub-only closed loops (30 s) with proposals_in_flight=K
OUT=$1; N=$2; shift 2; B=/work/main/target/release; mkdir -p $OUT
for i in $(seq 1 $N); do for k in "$@"; do
  TWINHUB_BENCH_NODE_OPTIONS=proposals_in_flight=$k $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $OUT/pif$k-$i.json > $OUT/pif$k-$i.txt 2>/dev/null
  echo "pif=$k $i $(grep -E '^twinhub ' $OUT/pif$k-$i.txt)"
done; done
