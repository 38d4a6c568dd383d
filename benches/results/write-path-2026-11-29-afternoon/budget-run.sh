#!/bin/bash
# A fixed-rate PATCH load on a fresh 3-node, 8-shard cluster; the three nodes' metrics 10 s apart during
# it, their CPU over the same 10 s, then: what the AppendEntries carried and the mean of each latency
# histogram (the half-load budget in benches/README.md). Environment variables pass through to the nodes.
#   [CLIENT=twinhub-bench] budget-run.sh BIN LABEL RATE        → /tmp/budget-LABEL/{m0-N,m1-N,run.txt}
BIN=$1; L=$2; RATE=$3
D=/tmp/budget-$L; rm -rf $D; mkdir -p $D/out
timeout 60 $BIN cluster up --nodes 3 --shard-count 8 --dir $D/cluster > /dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/cluster/" | tr '\n' ' ')
cpu() { c=0; for p in $PIDS; do c=$((c+$(awk '{print $14+$15}' /proc/$p/stat))); done; echo $c; }
scrape() { for i in 0 1 2; do H=$(python3 -c "import json;print(json.load(open('$D/cluster/cluster.json'))['nodes'][$i]['http'])"); curl -sk https://$H/metrics > $D/$1-$i; done; }
timeout 300 ${CLIENT:-twinhub-bench} run --cluster $D/cluster/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 --rate $RATE --duration 25 --out $D/run.json > $D/run.txt 2> $D/run.log &
B=$!
sleep 12; c0=$(cpu); scrape m0
sleep 10; c1=$(cpu); scrape m1
wait $B
timeout 30 $BIN cluster down --dir $D/cluster > /dev/null 2>&1
line=$(grep '^patch' $D/run.txt); rate=$(echo $line | awk '{print $4}')
echo "$L $line | cpu_ms/u=$(python3 -c "print(round(($c1-$c0)*10/10/$rate,3))")"
python3 - $D <<'PY'
import sys,re,collections
D=sys.argv[1]
def rd(f):
    d={}
    for l in open(f):
        if l.startswith('#') or not l.strip(): continue
        k,v=l.rsplit(' ',1)
        try: d[re.sub(r',?peer="[^"]*"','',k)]=d.get(re.sub(r',?peer="[^"]*"','',k),0)+float(v)
        except ValueError: pass
    return d
t=collections.Counter()
for i in range(3):
    a=rd(f'{D}/m0-{i}'); b=rd(f'{D}/m1-{i}')
    for k in b: t[k]+=b[k]-a.get(k,0)
print("   appends/s:", {k.split('"')[1]:round(v/10) for k,v in t.items() if k.startswith('twinhub_raft_appends_sent_total')},
      "entries/s:", round(t['twinhub_raft_entries_sent_total']/10))
for k,c in sorted(t.items()):
    if not k.endswith('_count') and '_count{' not in k: continue
    if not re.match(r'twinhub_(http_request|rpc_request|rpc_server_request|storage_fsync)', k) or c < 100: continue
    s=t[k.replace('_count','_sum',1)]
    print(f"   {k:90s} {c/10:8.0f}/s  mean {s/c*1000:6.2f} ms")
PY
