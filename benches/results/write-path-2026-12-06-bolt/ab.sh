#!/bin/bash
# VARIANTS="head pgo boltb" ab.sh OUT N: interleaved twinhub-only closed loops of the builds copied to /tmp/NAME (twinhub + twinhub-bench): head = cargo build --release, pgo = scripts/build-pgo.sh (with --emit-relocs), boltb = bolt.sh target/pgo/bolt/twinhub, hug = its -hugify twin
OUT=$1; N=$2; mkdir -p $OUT
for i in $(seq 1 $N); do for v in $VARIANTS; do
  B=/tmp/$v
  $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $OUT/$v-$i.json > $OUT/$v-$i.txt 2>$OUT/$v-$i.err
  echo "$v $i $(grep -E '^twinhub ' $OUT/$v-$i.txt)"
done; done
