#!/bin/bash
# usage: abstat.sh OUT label:bindir:calls ...  perf stat of syscalls and context switches per patch at 1500/s
out=$1; shift; mkdir -p $out
for spec in "$@"; do
  IFS=: read label dir slots <<< "$spec"
  d=/tmp/abstat-cl; rm -rf $d
  timeout 200 $dir/twinhub cluster up --nodes 3 --shard-count 16 --dir $d --bin $dir/twinhub --node-option raft_append_calls_per_peer=$slots > /dev/null 2>&1
  timeout 200 $dir/twinhub-bench run --cluster $d/cluster.json --devices 0 --twins 10000 --rate 1500 --mix patch=100 --concurrency 64 --duration 24 --out $out/$label.json > $out/$label.txt 2>&1 &
  bp=$!
  for i in $(seq 1 120); do grep -q "^\[fleet\]" $out/$label.txt && break; sleep 1; done
  sleep 5
  pids=$(python3 -c "import json;print(','.join(str(n['pid']) for n in json.load(open('$d/cluster.json'))['nodes']))")
  perf stat -x, -e 'syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,context-switches,task-clock' -p $pids -o $out/$label.stat -- sleep 10
  wait $bp
  $dir/twinhub cluster down --dir $d > /dev/null 2>&1
  echo "$label $(awk -F, '/^[0-9]/{printf "%s=%.2f ", $3, $1/15000}' $out/$label.stat)" >> $out/progress
done
