#!/bin/bash
# Fixed-rate PATCH run on a fresh 3-node cluster, with every per-second progress line timestamped
# (wall clock), the nodes' /metrics at the end, and a count of slow seconds.
#   [BIN=twinhub] [CLIENT=twinhub-bench] [DUR=60] [SC=16] timeline-run.sh LABEL RATE NICE [node-option ...]
# NICE other than 0 renices fjall's background threads (flushes, compactions) of every node to it.
# Run thread-cpu.py beside it to see which threads were busy in a slow second.
L=$1; R=$2; RN=$3; shift 3
BIN=${BIN:-twinhub}; CLIENT=${CLIENT:-twinhub-bench}
OPTS=""; for o in "$@"; do OPTS="$OPTS --node-option $o"; done
D=/tmp/fr-$L; rm -rf $D
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-16} --dir $D $OPTS >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
if [ "$RN" != 0 ]; then
  for p in $(pgrep -f "twinhub serve.*$D/"); do
    for t in /proc/$p/task/*; do
      case "$(cat $t/comm)" in fjall*) renice -n $RN -p $(basename $t) >/dev/null;; esac
    done
  done
fi
timeout 200 $CLIENT run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 \
  --rate $R --duration ${DUR:-60} --out $D/run.json 2>&1 >$D/run.txt \
  | while IFS= read -r l; do echo "$(date +%s.%N | cut -c1-14) $l"; done > $D/err.txt
for h in $(python3 -c "import json; print(' '.join(n['http'] for n in json.load(open('$D/cluster.json'))['nodes']))"); do
  curl -sk https://$h/metrics || curl -s http://$h/metrics
done > $D/metrics.txt
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
slow=$(grep 'ops/s' $D/err.txt | awk '{for(i=1;i<=NF;i++) if($i=="p99"){if($(i+1)>40) c++; break}} END{print c+0}')
echo "$L $(grep '^patch' $D/run.txt)  seconds with p99 > 40 ms: $slow"
