#!/bin/bash
# Twinhub-only compares, ABBA: the default runtime threads (one per core) against TWINHUB_BENCH_NODE_WORKER_THREADS=1.
# Usage: ab.sh OUTDIR [BINDIR, default target/release]
out=${1:?OUTDIR}; mkdir -p $out; B=${2:-target/release}; i=0
for v in two one one two two one; do i=$((i+1))
  if [ $v = one ]; then export TWINHUB_BENCH_NODE_WORKER_THREADS=1; else unset TWINHUB_BENCH_NODE_WORKER_THREADS; fi
  $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$v-$i.json > $out/$v-$i.txt 2>&1
  echo "$v $i $(grep -E '^twinhub +[0-9]' $out/$v-$i.txt | tr -s ' ')"
done
