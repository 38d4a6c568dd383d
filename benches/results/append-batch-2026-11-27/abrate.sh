#!/bin/bash
# Labels: a* = before (420ab77), b* = after (7c4ec14); off*/on* = one build with raft_append_calls_per_peer 0 / 2.
# s1/s2/s4 in fixed-rate-2.txt: a scratch build meant to read the count from an environment variable, which
# `twinhub cluster up` does not pass to its nodes: all three ran the default (2). /tmp/hN: the builds compared.
# usage: abrate.sh OUT RATE label:bindir ...  fixed-rate patches; server CPU ms/op over 12 s of steady load
out=$1; rate=$2; shift 2; mkdir -p $out
cpu() { local t=0; for p in $(python3 -c "import json;print(' '.join(str(n['pid']) for n in json.load(open('$1'))['nodes']))"); do
  set -- $(cut -d' ' -f14,15 /proc/$p/stat); t=$((t+$1+$2)); done; echo $t; }
for spec in "$@"; do
  IFS=: read label dir slots <<< "$spec"; export TWINHUB_RAFT_APPEND_CALLS_PER_PEER=${slots:-2}
  d=/tmp/abrate-cl; rm -rf $d
  timeout 200 $dir/twinhub cluster up --nodes 3 --shard-count 16 --dir $d --bin $dir/twinhub ${slots:+--node-option raft_append_calls_per_peer=$slots} > /dev/null 2>&1
  timeout 200 /tmp/h2/twinhub-bench run --cluster $d/cluster.json --devices 0 --twins 10000 --rate $rate --mix patch=100 --concurrency 64 --duration 24 --out $out/$label.json > $out/$label.txt 2>&1 &
  bp=$!
  # wait until the load has started (populate done): the progress lines appear
  for i in $(seq 1 120); do grep -q "^\[fleet\]" $out/$label.txt && break; sleep 1; done
  sleep 6; c0=$(cpu $d/cluster.json); sleep 12; c1=$(cpu $d/cluster.json)
  wait $bp
  tck=$(getconf CLK_TCK)
  ms=$(python3 -c "print(round(($c1-$c0)/$tck*1000/(12*$rate),3))")
  echo "$(date +%T) $label cpu_ms_per_op=$ms $(grep -E '^patch ' $out/$label.txt)" >> $out/progress
  $dir/twinhub cluster down --dir $d > /dev/null 2>&1
done
echo "done $(date +%T)" >> $out/progress
