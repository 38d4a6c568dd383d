#!/bin/bash
# Inter-node requests per acknowledged update: the three nodes' twinhub_rpc_* counters over 10 s of PATCH load.
#   [SC=8] [RATE=R] [CLIENT=twinhub-bench] messages-per-update.sh BIN LABEL   (closed loop without RATE)
BIN=$1; L=$2; shift 2
D=/tmp/msg-$L; rm -rf $D
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-8} --dir $D >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
timeout 300 ${CLIENT:-twinhub-bench} run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 ${RATE:+--rate $RATE} --duration 25 --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!
sleep 12
HS=$(python3 -c "import json; print(' '.join(n['http'] for n in json.load(open('$D/cluster.json'))['nodes']))")
for h in $HS; do curl -sk https://$h/metrics; done | grep -E "^twinhub_rpc_(requests_total|append_batched_total|server_requests_total)" > $D/m0
sleep 10
for h in $HS; do curl -sk https://$h/metrics; done | grep -E "^twinhub_rpc_(requests_total|append_batched_total|server_requests_total)" > $D/m1
wait $B
grep '^patch' $D/run.txt
python3 - $D/m0 $D/m1 $(grep '^patch' $D/run.txt | awk '{print $4}') <<'PY'
import sys,collections
def rd(f):
    d=collections.defaultdict(float)
    for l in open(f):
        k,v=l.rsplit(' ',1); d[k]+=float(v)
    return d
a,b=rd(sys.argv[1]),rd(sys.argv[2]); rate=float(sys.argv[3])
for k in sorted(b):
    dv=b[k]-a.get(k,0)
    if dv>0: print(f"{dv/10:9.0f}/s {dv/10/rate:6.3f}/update  {k}")
PY
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
