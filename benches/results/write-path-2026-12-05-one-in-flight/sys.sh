#!/bin/bash
# sys.sh BINDIR OUT: twinhub-only compare; syscall counts of the servers and client over 15 s of the window
B=$1; O=$2
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O.json > $O.txt 2> $O.log &
P=$!
until grep -q "closed loop" $O.log 2>/dev/null; do sleep 1; done
sleep 10
S=$(pgrep -x twinhub | paste -sd,); C=$(pgrep -f "twinhub-bench compare" | head -1)
EV=$(for s in recvfrom sendto writev readv read write epoll_wait futex sendmsg recvmsg epoll_ctl fsync pwrite64 io_uring_enter sched_yield clock_nanosleep; do printf "syscalls:sys_enter_%s," $s; done)
perf stat -x, -e "raw_syscalls:sys_enter,${EV%,}" -p $S -- sleep 15 2> $O.srv &
perf stat -x, -e "raw_syscalls:sys_enter,${EV%,}" -p $C -- sleep 15 2> $O.cli
wait
grep -E '^twinhub ' $O.txt
U=$(grep -E '^twinhub ' $O.txt | awk '{print $2*15}')
for f in srv cli; do echo "== $f per update"; awk -F, -v u=$U '{printf "%8.3f %s\n", $1/u, $3}' $O.$f; done
