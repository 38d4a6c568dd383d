#!/bin/bash
# run.sh BINDIR OUTDIR N: N half-load sweeps (`latency-sweep --percents 50 --duration 30`) keeping every
# node's data directory and log (TWINHUB_BENCH_KEEP=1, RUST_LOG=info) under OUTDIR/tmp-I.
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-3}
for i in $(seq 1 $n); do
  mkdir -p $out/tmp-$i
  TWINHUB_BENCH_TMP=$out/tmp-$i TWINHUB_BENCH_KEEP=1 TWINHUB_BENCH_NODE_LOG=info $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
  echo "$i $(grep -E '^(max|50%) ' $out/sweep-$i.txt | tr -s ' ' | tr '\n' '|')"
done
