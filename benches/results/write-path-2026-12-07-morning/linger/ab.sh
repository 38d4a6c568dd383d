#!/bin/bash
# ab.sh BINDIR OUTDIR PAIRS US...: half-load sweeps (`latency-sweep --percents 50 --duration 30`) of one
# prototype binary, its proposal linger (PROTO_LINGER_US) at each of US in turn, PAIRS times, with the
# nodes' threads and the machine read every second beside them.
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:?PAIRS}; shift 3; mkdir -p $out; e=$(dirname $0)/../../write-path-2026-12-07-early
python3 $e/machine/machine.py $out/machine.txt & m=$!
python3 $e/threads/threads.py $out/threads.txt & t=$!
i=0
for r in $(seq 1 $n); do
  for us in "$@"; do
    i=$((i+1))
    echo "sweep $i start $(date +%T) linger $us" >> $out/marks.txt
    PROTO_LINGER_US=$us $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
    echo "$i $(date +%T) 50% $(grep -E '^50% ' $out/sweep-$i.txt | tr -s ' ' | cut -d' ' -f2-) linger $us" | tee -a $out/marks.txt
  done
done
kill $m $t
