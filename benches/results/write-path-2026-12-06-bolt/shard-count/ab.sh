#!/bin/bash
# ab.sh OUT N: interleaved twinhub-only closed loops of one build (/tmp/head): the default (one shard) vs --shard-count 2
OUT=$1; N=$2; mkdir -p $OUT; B=/tmp/head
for i in $(seq 1 $N); do for v in one two; do
  if [ $v = two ]; then X="--shard-count 2"; else X=""; fi
  $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 $X --out $OUT/$v-$i.json > $OUT/$v-$i.txt 2>$OUT/$v-$i.err
  echo "$v $i $(grep -E '^twinhub ' $OUT/$v-$i.txt)"
done; done
