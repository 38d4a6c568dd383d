#!/bin/bash
# run.sh BINDIR OUTDIR N: N half-load sweeps (`latency-sweep --percents 50 --duration 30`), each under a
# machine-wide perf sampling (499 Hz on every CPU, no call graphs, wall-clock timestamps), the sweep's
# progress lines stamped with the wall clock, so that phases.py can set the maximum's samples beside the
# half load's, per update.
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-2}; mkdir -p $out
for i in $(seq 1 $n); do
  perf record -a -F 499 -k CLOCK_REALTIME -o $out/perf-$i.data -q 2>/dev/null & p=$!
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json 2>&1 > $out/sweep-$i.txt \
    | while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done > $out/sweep-$i.err
  kill -INT $p; wait $p
  echo "$i $(date +%T) $(grep -E '^50% ' $out/sweep-$i.txt | tr -s ' ')"
done
