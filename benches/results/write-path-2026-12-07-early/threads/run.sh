#!/bin/bash
# run.sh BINDIR OUTDIR N: N half-load sweeps (`latency-sweep --percents 50 --duration 30`) with threads.py
# (beside this file) writing, every second, the CPU each thread name of the nodes and the load generator used.
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-5}; mkdir -p $out
python3 $(dirname $0)/threads.py $out/threads.txt & s=$!
for i in $(seq 1 $n); do
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
  echo "$i $(date +%T) $(grep -E '^(50%) ' $out/sweep-$i.txt | tr -s ' ')"
done
kill $s
