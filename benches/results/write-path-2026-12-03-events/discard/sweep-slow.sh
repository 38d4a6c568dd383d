#!/usr/bin/env bash
# sweep-slow.sh BIN_DIR LABEL: a latency sweep against a fresh 3-node cluster, then each node's slow fsyncs, append timeouts and snapshots
BD=$1; L=$2; D=/tmp/stall/$L; rm -rf $D
$BD/twinhub cluster up --nodes 3 --dir $D >/dev/null 2>&1
TWINHUB_BIN=$BD/twinhub $BD/twinhub bench latency-sweep --cluster $D/cluster.json --duration 20 --out $D-sweep.json > $D-sweep.txt 2> $D-sweep.err
grep -E "^(max|25|50|75)" $D-sweep.txt
for n in 0 1 2; do
  A=$(python3 -c "import json;print(json.load(open('$D/cluster.json'))['nodes'][$n]['http'])")
  curl -sk https://$A/metrics | python3 -c "
import sys,re
b={};t=0;snap=0
for l in sys.stdin:
    m=re.match(r'twinhub_storage_fsync_seconds_bucket\{le=\"([^\"]+)\"\} (\S+)',l)
    if m: b[m.group(1)]=float(m.group(2))
    if l.startswith('twinhub_rpc_errors_total{kind=\"append\"') and 'timeout' in l: t+=float(l.split()[-1])
    if l.startswith('twinhub_snapshot_encode_seconds_count'): snap=float(l.split()[-1])
print('node $((n+1)): fsyncs', int(b['+Inf']), '>50ms', int(b['+Inf']-b['0.05']), '>100ms', int(b['+Inf']-b['0.1']), '>500ms', int(b['+Inf']-b['0.5']), 'append timeouts', int(t), 'snapshots', int(snap))"
done
$BD/twinhub cluster down --dir $D >/dev/null 2>&1
