#!/bin/bash
# rideab.sh OUT N: interleaved twinhub-only closed loops (30 s), base (/tmp/fin111) vs ride (/tmp/ride)
OUT=$1; N=$2; mkdir -p $OUT
for i in $(seq 1 $N); do for v in ride fin111; do
  B=/tmp/$v
  $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $OUT/$v-$i.json > $OUT/$v-$i.txt 2>/dev/null
  echo "$v $i $(grep -E '^twinhub ' $OUT/$v-$i.txt)"
done; done
