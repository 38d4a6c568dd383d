#!/bin/bash
# sweeps.sh BINDIR OUTDIR N: N half-load sweeps (`latency-sweep --percents 50 --duration 30`), each vCPU's
# busy share read every second beside them (percpu.py); phases.py OUTDIR then gives each phase's means.
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-6}; mkdir -p $out; here=$(dirname $0)
python3 $here/percpu.py $out/percpu.txt & p=$!
for i in $(seq 1 $n); do
  echo "sweep $i start $(date +%T)" >> $out/marks.txt
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
  echo "sweep $i end $(date +%T) $(grep -E '^(max|50%) ' $out/sweep-$i.txt | tr -s ' ' | tr '\n' ' ')" | tee -a $out/marks.txt
done
kill $p
