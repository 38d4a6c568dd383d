#!/bin/bash
# Half-load sweeps with the disk sampled every second beside them. Usage: run.sh BINDIR OUTDIR N
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-2}; mkdir -p $out
for i in $(seq 1 $n); do
  python3 $(dirname $0)/disk.py $out/disk-$i.txt & s=$!
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
  kill $s
  echo "$i $(grep -E '^(max|50%) ' $out/sweep-$i.txt | tr -s ' ' | tr '\n' '|')"
done
