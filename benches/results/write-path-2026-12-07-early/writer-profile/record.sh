#!/bin/bash
# record.sh BINDIR OUTDIR: a twinhub-only closed-loop compare; from its 10th second, 10 s of `perf record -F 999 -g`
# on the three nodes' group-commit writer threads only, and 5 s of the nodes' task-clock. Then summarise.py.
B=${1:?BINDIR}; O=${2:?OUTDIR}; mkdir -p $O
($B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/compare.json > $O/compare.txt 2> $O/compare.err &)
for i in $(seq 1 120); do grep -q "10s " $O/compare.err 2>/dev/null && break; sleep 1; done
tids=$(for p in $(pgrep -f "twinhub serve"); do for t in /proc/$p/task/*; do grep -q raft-group-comm $t/comm && echo ${t##*/}; done; done | paste -sd,)
perf record -F 999 -g -t $tids -o $O/writer.perf -- sleep 10
perf stat -e task-clock -p $(pgrep -f "twinhub serve" | paste -sd,) -- sleep 5 2>&1 | grep task-clock > $O/nodes-task-clock.txt
perf script -i $O/writer.perf > $O/writer.perf-script && gzip -f $O/writer.perf-script
python3 $(dirname $0)/summarise.py $O/writer.perf-script.gz | tee $O/summary.txt
