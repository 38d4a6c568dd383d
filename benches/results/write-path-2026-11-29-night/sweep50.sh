#!/bin/bash
# sweep50.sh BIN LABEL [node-option ...]: fresh 3-node 8-shard cluster, latency-sweep at 50 % only (30 s)
BIN=$1; L=$2; shift 2
CLIENT=${CLIENT:-/tmp/hB/twinhub-bench}
OPTS=""; for o in "$@"; do OPTS="$OPTS --node-option $o"; done
D=/tmp/sw-$L; rm -rf $D
timeout 60 $BIN cluster up --nodes 3 --shard-count 8 --dir $D $OPTS >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
timeout 300 $CLIENT latency-sweep --cluster $D/cluster.json --percents 50 --duration ${DUR:-30} --out $D/sweep.json 2>&1 >$D/sweep.txt | while IFS= read -r l; do echo "$(date +%s.%N | cut -c1-14) $l"; done > $D/sweep.log
for h in $(python3 -c "import json; print(' '.join(n['http'] for n in json.load(open('$D/cluster.json'))['nodes']))"); do
  curl -sk https://$h/metrics || curl -s http://$h/metrics
done > $D/metrics.txt
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
python3 - $D/sweep.json $L <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
ph={p['phase']:p for p in d['phases']}
m=d['max_updates_per_s']; p=ph.get('50%')
sec=[round(x['p99_ms']) for x in p['series']]
print(f"{sys.argv[2]}: max {m:.0f}/s  50%: {p['achieved_per_s']:.0f}/s p50 {p['p50_ms']:.1f} p99 {p['p99_ms']:.1f} p99.9 {p['p999_ms']:.1f}  per-second p99: {sec}")
PY
