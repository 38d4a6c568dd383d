#!/bin/bash
# ab.sh A B OUT N: interleaved twinhub-only closed loops
A=$1; B=$2; OUT=$3; N=$4; mkdir -p $OUT
for i in $(seq 1 $N); do
  for X in A B; do
    if [ $X = A ]; then D=$A; else D=$B; fi
    $D/twinhub-bench compare --bin $D/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $OUT/$X-$i.json > $OUT/$X-$i.txt 2>/dev/null
    echo "$X $i $(grep -E '^twinhub ' $OUT/$X-$i.txt)"
  done
done
