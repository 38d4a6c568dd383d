#!/bin/bash
# Profile of a 3-node cluster under PATCH load (closed loop, or RATE updates/s), with syscall counts.
#   [RATE=200] SC=16 CLIENT=path/to/twinhub-bench profile-run.sh path/to/twinhub LABEL [node-option ...]
# Leaves /tmp/pf-LABEL/{run.txt,stat.txt,perf.data}; fold with
#   perf script -i /tmp/pf-LABEL/perf.data | inferno-collapse-perf --all > LABEL.folded
BIN=$1; L=$2; shift 2
CLIENT=${CLIENT:-twinhub-bench}
D=/tmp/pf-$L; rm -rf $D
OPTS=""; for o in "$@"; do OPTS="$OPTS --node-option $o"; done
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-16} --dir $D $OPTS >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/" | paste -sd,)
timeout 300 $CLIENT run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 ${RATE:+--rate $RATE} \
  --duration 40 --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!
sleep 18
perf stat -x, -e 'syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_recvfrom,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_fsync,context-switches,task-clock' \
  -p $PIDS -- sleep 8 2> $D/stat.txt
perf record -F 149 --call-graph dwarf,32768 -p $PIDS -o $D/perf.data -- sleep 8 >/dev/null 2>&1
wait $B
grep '^patch' $D/run.txt
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
