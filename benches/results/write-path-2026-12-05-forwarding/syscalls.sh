#!/bin/bash
# usage: sysc.sh BINDIR OUT
B=$1; O=$2
EV=$(for s in writev write recvfrom read futex epoll_wait sendto sendmsg recvmsg fdatasync fsync sched_yield pwrite64 readv io_uring_enter; do printf 'syscalls:sys_enter_%s,' $s; done)
EV=${EV%,},context-switches
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 40 --concurrency 64 --twins 10000 --value-bytes 200 --out $O.json > $O.txt 2>$O.err &
bp=$!
sleep 22
sp=$(pgrep -f "$B/twinhub serve" | tr '\n' ',' ); sp=${sp%,}
[ -z "$sp" ] && sp=$(pgrep -x twinhub | tr '\n' ','); sp=${sp%,}
cp=$(pgrep -f twinhub-bench | head -1)
echo "servers $sp client $cp" > $O.perf
perf stat -e "$EV" -p $sp -- sleep 10 2>> $O.perf &
perf stat -e "$EV" -p $cp -- sleep 10 2>> $O.perf.client
wait $bp
grep -A1 "updates/s" $O.txt
