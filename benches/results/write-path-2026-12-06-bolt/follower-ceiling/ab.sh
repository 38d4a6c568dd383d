#!/bin/bash
# run.sh OUT N: the experiment build (/tmp/expb) with /tmp/twinhub-exp-follower holding 0 (as main), 1 (followers skip
# rendering the reply), 2 (followers skip the twin update): interleaved twinhub-only closed loops
OUT=$1; N=$2; mkdir -p $OUT; B=/tmp/expb
for i in $(seq ${FIRST:-1} $N); do for v in 0 1 2; do
  echo $v > /tmp/twinhub-exp-follower; $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $OUT/m$v-$i.json > $OUT/m$v-$i.txt 2>$OUT/m$v-$i.err
  echo "m$v $i $(grep -E '^twinhub ' $OUT/m$v-$i.txt)"
done; done
