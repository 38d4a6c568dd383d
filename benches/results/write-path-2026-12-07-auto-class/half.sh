#!/bin/bash
# Below saturation ABBA, same binary: the default (auto) against cpu_scheduling="normal"; 25 % and 50 % of the closed-loop maximum.
# Usage: OUTDIR [BINDIR, default target/release]; BINDIR must hold a build with auto-governor.patch applied (main has no `auto`).
out=${1:?OUTDIR}; mkdir -p $out
B=${2:-target/release}
i=0
for v in auto normal normal auto auto normal normal auto; do i=$((i+1))
  if [ $v = normal ]; then export TWINHUB_BENCH_NODE_OPTIONS='cpu_scheduling="normal"'; else unset TWINHUB_BENCH_NODE_OPTIONS; fi
  $(dirname $0)/classes.sh $out/$v-$i.cls & s=$!
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 25,50 --duration 20 --out $out/$v-$i.json > $out/$v-$i.txt 2> $out/$v-$i.err
  kill $s
  echo "$v $i $(grep -E '^max \(closed|^25% |^50% ' $out/$v-$i.txt | tr -s ' ' | tr '\n' '|')"
done
