#!/bin/bash
# Half-load ABBA of the final commit: the default class (batch) against --cpu-scheduling normal, same binary.
out=${1:?OUTDIR}; mkdir -p $out
B=/work/main/target/release
i=0
for v in normal batch batch normal normal batch batch normal; do i=$((i+1))
  if [ $v = normal ]; then export TWINHUB_BENCH_NODE_OPTIONS='cpu_scheduling="normal"'; else unset TWINHUB_BENCH_NODE_OPTIONS; fi
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 20 --out $out/$v-$i.json > $out/$v-$i.txt 2> $out/$v-$i.err
  echo "$v $i $(grep -E '^max \(closed|^50% ' $out/$v-$i.txt | tr -s ' ' | tr '\n' '|') io: $(grep some /proc/pressure/io)"
done
