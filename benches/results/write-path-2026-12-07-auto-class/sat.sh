#!/bin/bash
# Saturation ABBA, same binary: the default (auto) against cpu_scheduling="normal".
# Usage: OUTDIR [BINDIR, default target/release]; BINDIR must hold a build with auto-governor.patch applied (main has no `auto`).
out=${1:?OUTDIR}; mkdir -p $out
B=${2:-target/release}
i=0
for v in auto normal normal auto auto normal normal auto; do i=$((i+1))
  if [ $v = normal ]; then export TWINHUB_BENCH_NODE_OPTIONS='cpu_scheduling="normal"'; else unset TWINHUB_BENCH_NODE_OPTIONS; fi
  $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$v-$i.json > $out/$v-$i.txt 2>&1
  echo "$v $i $(grep -E '^twinhub ' $out/$v-$i.txt | tr -s ' ')"
done
