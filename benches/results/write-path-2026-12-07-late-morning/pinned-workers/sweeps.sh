#!/bin/bash
# sweeps.sh BINDIR OUTDIR PAIRS: half-load sweeps (`latency-sweep --percents 50 --duration 30`) alternating
# PROTO_PIN=1 (each node's runtime workers pinned one per CPU) and the default, the vCPUs' busy share read
# every second (../vcpu-busy/percpu.py).
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:-3}; mkdir -p $out; here=$(dirname $0)
python3 $here/../vcpu-busy/percpu.py $out/percpu.txt & p=$!
for i in $(seq 1 $n); do
  for v in $( ((i % 2)) && echo "1 0" || echo "0 1"); do
    echo "pin=$v run $i start $(date +%T)" >> $out/marks.txt
    PROTO_PIN=$v $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i-pin$v.json > $out/sweep-$i-pin$v.txt 2> $out/sweep-$i-pin$v.err
    echo "pin=$v run $i end $(date +%T) $(grep -E '^(max|50%) ' $out/sweep-$i-pin$v.txt | tr -s ' ' | tr '\n' ' ')" | tee -a $out/marks.txt
  done
done
kill $p
