#!/bin/bash
# wake.sh SC LABEL: twinhub-only compare at SC shards; sched_switch/wakeup counts on the 3 nodes for 5 s
SC=$1; L=$2; W=/tmp/wake-$L; rm -rf $W; mkdir -p $W   # BD: the directory of the release build (default target/release)
${BD:-target/release}/twinhub bench compare --systems twinhub --shard-count $SC --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/c.json > $W/c.txt 2> $W/c.log &
B=$!
until grep -q "closed loop" $W/c.log 2>/dev/null; do sleep 1; done
sleep 10
PIDS=$(pgrep -f "${BD:-target/release}/twinhub serve" | paste -sd, -)
perf record -e sched:sched_switch -e sched:sched_wakeup -p "$PIDS" -o $W/perf.data -- sleep 5 2>/dev/null >/dev/null
perf stat -e context-switches,cpu-migrations,task-clock -p "$PIDS" -- sleep 5 2> $W/stat.txt
wait $B
grep -E '^twinhub ' $W/c.txt
perf script -i $W/perf.data -F comm,event,trace 2>/dev/null > $W/events.txt
