#!/bin/bash
# run.sh BINDIR OUTDIR: a twinhub-only compare; machine-wide counts of idle entries/exits, IPIs sent and
# received, wake-ups and switches over 10 s of its window (perf-stat.txt)
B=$1; W=$2; mkdir -p $W
($B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/c.json > $W/c.txt 2> $W/c.log &)
sleep 2; until grep -q "closed loop" $W/c.log 2>/dev/null; do sleep 1; done; sleep 8
perf stat -a -x, -e 'power:cpu_idle,ipi:ipi_send_cpu,irq_vectors:reschedule_entry,sched:sched_wakeup,sched:sched_switch' -o $W/perf-stat.txt -- sleep 10
while pgrep -f "twinhub-bench compare" >/dev/null; do sleep 2; done
cat $W/perf-stat.txt; grep -E "^twinhub " $W/c.txt
