#!/bin/bash
# sweepride.sh OUT N: interleaved half-load sweeps, 5014c88 (/tmp/final-5014) vs 111ffbb (/tmp/fin111)
OUT=$1; N=$2; mkdir -p $OUT
for i in $(seq 1 $N); do for v in final-5014 fin111; do
  B=/tmp/$v
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 20 --out $OUT/$v-$i.json > $OUT/$v-$i.txt 2>/dev/null
  echo "$v $i $(grep -E '^(max|50%)' $OUT/$v-$i.txt | tr -s ' ' | tr '\n' ' ')"
done; done
