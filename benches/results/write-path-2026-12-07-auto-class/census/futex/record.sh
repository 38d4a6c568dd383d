#!/bin/bash
# Context switches and futex calls of the three nodes' threads for 3 s at 25 % of the maximum (10 s into the phase).
# Usage: record.sh BINDIR OUTDIR ; then: perf script -i OUTDIR/futex.perf -F comm,event | awk '{print $1, $2}' | sort | uniq -c
B=${1:?BINDIR}; O=${2:?OUTDIR}; mkdir -p $O
($B/twinhub-bench latency-sweep --bin $B/twinhub --percents 25 --duration 30 --out $O/sweep.json > $O/sweep.out 2>&1 &)
for i in $(seq 1 150); do grep -q "^\[25%\]    10s" $O/sweep.out 2>/dev/null && break; sleep 1; done
perf record -e syscalls:sys_enter_futex -e sched:sched_switch -g -p $(pgrep -f "twinhub serve" | paste -sd,) -o $O/futex.perf -- sleep 3
