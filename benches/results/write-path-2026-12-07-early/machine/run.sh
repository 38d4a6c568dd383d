#!/bin/bash
# run.sh BINDIR OUTDIR N: N half-load sweeps with the machine (machine.py), the disk (disk.py) and the
# nodes' threads (threads.py) read every second beside them.
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-8}; mkdir -p $out; here=$(dirname $0)
python3 $here/machine.py $out/machine.txt & m=$!
python3 $here/../../write-path-2026-12-07-auto-class/stalls/disk.py $out/disk.txt & d=$!
python3 $here/../threads/threads.py $out/threads.txt & t=$!
for i in $(seq 1 $n); do
  $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
  echo "$i $(date +%T) $(grep -E '^(50%) ' $out/sweep-$i.txt | tr -s ' ')"
done
kill $m $d $t
