#!/bin/bash
# census.sh BINDIR OUT: system calls and context switches of the 3 nodes over 10 s of a twinhub-only compare (perf stat tracepoints); OUT/c.json has the run's per-second series to count the updates in that window
BD=$1; W=$2; rm -rf $W; mkdir -p $W
(TWINHUB_BIN=$BD/twinhub $BD/twinhub bench compare --bin $BD/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/c.json > $W/c.txt 2> $W/c.log &)
until grep -q "closed loop" $W/c.log 2>/dev/null; do sleep 1; done; sleep 8
PIDS=$(pgrep -f "$BD/twinhub serve" | paste -sd, -)
perf stat -e 'syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_fdatasync,context-switches' -p $PIDS -- sleep 10 2> $W/stat.txt
grep -E "ops/s" $W/c.log | tail -12 | head -10 > $W/during.txt
while pgrep -f "$BD/twinhub-bench|$BD/twinhub bench" >/dev/null; do sleep 1; done
grep twinhub $W/c.txt
