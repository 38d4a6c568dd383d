#!/bin/bash
# offcpu.sh BINDIR OUT THREADS: the half-load phase (latency-sweep --percents 50 --duration 30) with
# THREADS runtime threads per node; records every context switch of the nodes (DWARF stacks) for 8 s
# of the phase into OUT/perf.data. Then: perf script -i OUT/perf.data | python3 offcpu.py
B=$1; O=$2; T=$3; rm -rf $O; mkdir -p $O
TWINHUB_BENCH_NODE_WORKER_THREADS=$T $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $O/s.json > $O/s.txt 2> $O/s.log &
P=$!
until grep -q "50%" $O/s.log 2>/dev/null; do kill -0 $P 2>/dev/null || { tail $O/s.log; exit 1; }; sleep 1; done
sleep 5
PIDS=$(pgrep -f "$B/twinhub serve" | paste -sd, -)
perf record -e sched:sched_switch --call-graph dwarf,8192 -p "$PIDS" -o $O/perf.data -- sleep 8 > /dev/null 2>&1
wait $P
grep -E "^50%" $O/s.txt
