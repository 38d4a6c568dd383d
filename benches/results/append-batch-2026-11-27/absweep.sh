#!/bin/bash
# usage: absweep.sh OUT label:bindir:calls ...  latency sweep (max + 50 %) on a cluster started with --node-option raft_append_calls_per_peer=calls
out=$1; shift; mkdir -p $out
for spec in "$@"; do
  IFS=: read label dir slots <<< "$spec"
  d=/tmp/absweep-cl; rm -rf $d
  timeout 200 $dir/twinhub cluster up --nodes 3 --shard-count 16 --dir $d --bin $dir/twinhub --node-option raft_append_calls_per_peer=$slots > /dev/null 2>&1
  timeout 400 $dir/twinhub-bench latency-sweep --cluster $d/cluster.json --duration 20 --percents 50 --out $out/$label.json > $out/$label.txt 2> $out/$label.log
  echo "$(date +%T) $label $(grep -E '^(max|50%)' $out/$label.txt | tr -s ' ' | tr '\n' '|')" >> $out/progress
  $dir/twinhub cluster down --dir $d > /dev/null 2>&1
done
echo "done $(date +%T)" >> $out/progress
