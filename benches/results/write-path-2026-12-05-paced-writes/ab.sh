#!/bin/bash
# ab.sh LABEL BINDIR [node-option...]: fresh 3-node cluster, warm 15 s closed loop, 30 s at 7,000/s with a 0.1 s thread/disk sampler
O=/tmp/tl/out; mkdir -p $O
L=$1; B=$2; shift 2
NO=""; for o in "$@"; do NO="$NO --node-option $o"; done
D=/tmp/tl/cl; rm -rf $D; $B/twinhub cluster up --dir $D $NO > /dev/null 2>&1 || { echo up failed; exit 1; }
$B/twinhub-bench run --cluster $D/cluster.json --devices 0 --twins 10000 --concurrency 64 --mix patch=100 --value-bytes 200 --duration 15 --out $O/$L-warm.json > /dev/null 2>&1
PIDS=$(grep -o '"pid": [0-9]*' $D/cluster.json | awk '{print $2}')
PORTS=$(grep -o '"http": "127.0.0.1:[0-9]*' $D/cluster.json | cut -d: -f3)
fsm() { for p in $PORTS; do curl -sk https://127.0.0.1:$p/metrics | awk '/^twinhub_storage_fsync_seconds_count/{c=$2} /twinhub_storage_fsync_seconds_bucket\{le="0.005"\}/{f=$2} /twinhub_storage_fsync_seconds_bucket\{le="0.01"\}/{g=$2} END{printf "%s %s %s ", c, c-f, c-g}'; done; }
f0=$(fsm)
python3 /tmp/tl/sample.py $O/$L.samples 36 $PIDS &
$B/twinhub-bench run --cluster $D/cluster.json --devices 0 --twins 10000 --rate 7000 --concurrency 64 --mix patch=100 --value-bytes 200 --duration 30 --out $O/$L.json > $O/$L.txt 2> $O/$L.err
wait
for p in $PORTS; do curl -sk https://127.0.0.1:$p/metrics | grep -E "^[a-z]*_snapshot_(image|encode|lock|cpu)_seconds_(sum|count)|^twinhub_snapshot_bytes"; echo; done > $O/$L.snapm
f1=$(fsm); echo "$f0" > $O/$L.fsync; echo "$f1" >> $O/$L.fsync
cp $D/node-*/twinhub.log $O/ 2>/dev/null; for n in 1 2 3; do cp $D/node-$n/*.log $O/$L-node$n.log 2>/dev/null; done
$B/twinhub cluster down --dir $D > /dev/null 2>&1
python3 - $O/$L.json $L <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); 
p=d['phases'][0] if 'phases' in d else d
print(sys.argv[2], {k:p.get(k) for k in ('achieved_per_s','p50_ms','p99_ms','max_ms')} if 'phases' in d else list(d)[:10])
PY
