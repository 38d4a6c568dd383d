#!/bin/bash
# statrate.sh BIN LABEL RATE: open-loop patch load at RATE on a fresh 3-node cluster; perf stat of the nodes over 8 s,
# printed per acknowledged update (RATE x 8 updates in the window), and the bench's patch line.
BIN=$1; L=$2; R=$3
D=/tmp/sr-$L; rm -rf $D
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-16} --dir $D >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/" | paste -sd,)
timeout 300 ${CLIENT:-twinhub-bench} run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --rate $R --concurrency 64 --duration 30 --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!
sleep 12
perf stat -x, -e 'syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,context-switches,task-clock' -p $PIDS -- sleep 8 2> $D/stat.txt
wait $B
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
python3 - "$D/stat.txt" "$R" "$L" "$(grep '^patch' $D/run.txt)" <<'PY'
import sys
n=float(sys.argv[2])*8
out=[]
for line in open(sys.argv[1]):
    f=line.strip().split(',')
    if len(f)<3 or not f[0].replace('.','').isdigit(): continue
    v=float(f[0]); name=f[2].replace('syscalls:sys_enter_','')
    out.append(f"{name}={v/n*(1 if name!='task-clock' else 1):.2f}" + ("ms" if name=='task-clock' else ""))
p=sys.argv[4].split()
print(sys.argv[3], ' '.join(out), f"p50={p[4]} p99={p[6]}")
PY
