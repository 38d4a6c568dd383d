#!/bin/bash
# Socket and wake-up system calls per update of a fresh 3-node cluster under PATCH load (closed loop, or RATE/s).
#   [RATE=R] CLIENT=path/to/twinhub-bench syscalls-run.sh BIN LABEL
BIN=$1; L=$2; D=/tmp/sc-$L; rm -rf $D
timeout 60 $BIN cluster up --nodes 3 --shard-count 8 --dir $D >/dev/null 2>&1 || { echo "up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/" | paste -sd,)
timeout 300 ${CLIENT:-twinhub-bench} run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 ${RATE:+--rate $RATE} --duration 25 --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!; sleep 12
perf stat -x, -e 'syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_futex,context-switches' -p $PIDS sleep 10 2> $D/perf.txt
wait $B
rate=$(grep '^patch' $D/run.txt | awk '{print $4}')
echo "$L rate=$rate"; awk -F, -v r=$rate '{printf "  %-36s %8.2f /u\n", $3, $1/(r*10)}' $D/perf.txt
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
