#!/bin/bash
# sliceab.sh OUT N NS...: interleaved twinhub-only closed loops, server threads' slice set to NS (0 = default)
OUT=$1; N=$2; shift 2; B=/work/main/target/release; mkdir -p $OUT
for i in $(seq 1 $N); do for ns in "$@"; do
  if [ $ns != 0 ]; then python3 /tmp/cs/slice.py $ns 2>/dev/null & SP=$!; fi
  $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 20 --concurrency 64 --twins 10000 --value-bytes 200 --out $OUT/$ns-$i.json > $OUT/$ns-$i.txt 2>/dev/null
  [ $ns != 0 ] && kill $SP
  echo "$ns $i $(grep -E '^twinhub ' $OUT/$ns-$i.txt)"
done; done
