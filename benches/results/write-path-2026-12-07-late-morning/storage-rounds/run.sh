#!/bin/bash
# run.sh BINDIR OUTDIR N: N half-load sweeps (`latency-sweep --percents 50 --duration 30`) with, every second
# beside them, the machine's CPU split (steal included), the disk, the nodes' threads and the nodes' own
# /metrics (metrics.py).
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-8}; mkdir -p $out; here=$(dirname $0); e=$here/../../write-path-2026-12-07-early; s=$here/../../write-path-2026-12-07-morning/stall-hunt
python3 $e/machine/machine.py $out/machine.txt & m=$!
python3 $here/../../write-path-2026-12-07-auto-class/stalls/disk.py $out/disk.txt & d=$!
python3 $e/threads/threads.py $out/threads.txt & t=$!
python3 $here/metrics.py $out/metrics.txt & x=$!
for i in $(seq 1 $n); do
  echo "sweep $i start $(date +%T)" >> $out/marks.txt
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
  echo "$i $(date +%T) $(grep -E '^(50%) ' $out/sweep-$i.txt | tr -s ' ')" | tee -a $out/marks.txt
done
kill $m $d $t $x
