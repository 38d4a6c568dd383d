#!/bin/bash
# run.sh BINDIR OUTDIR N: N half-load sweeps (`latency-sweep --percents 50 --duration 30`), each under a
# machine-wide perf sampling (499 Hz on every CPU, no call graphs, wall-clock timestamps) so that a slow
# second can be looked at afterwards (slow.py), with the machine's CPU split read every second beside.
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-10}; mkdir -p $out; e=$(dirname $0)/../../write-path-2026-12-07-early
python3 $e/machine/machine.py $out/machine.txt & m=$!
for i in $(seq 1 $n); do
  echo "sweep $i start $(date +%T)" >> $out/marks.txt
  perf record -a -F 499 -k CLOCK_REALTIME -o $out/perf-$i.data -q 2>/dev/null & p=$!
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
  kill -INT $p; wait $p
  echo "$i $(date +%T) 50% $(grep -E '^50% ' $out/sweep-$i.txt | tr -s ' ' | cut -d' ' -f2-)" | tee -a $out/marks.txt
done
kill $m
