#!/bin/bash
# scrape.sh BINDIR LABEL SHARDS TWINS: compare with metrics scraped at window start (+2 s) and end (-2 s)
B=$1; L=$2; S=$3; T=$4; O=/tmp/big
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --shard-count $S --duration 30 --concurrency 64 --twins $T --value-bytes 200 --out $O/$L.json > $O/$L.txt 2> $O/$L.err &
P=$!
until grep -q "closed loop" $O/$L.err 2>/dev/null; do kill -0 $P 2>/dev/null || break; sleep 0.5; done
sleep 7
D=$(ps -eo args | grep "$B/twinhub serve" | grep -v grep | head -1 | sed 's/.*--config \(.*\)\/node-1.*/\1/')
for n in 1 2 3; do p=$(grep http_listen $D/node-$n/twinhub.toml | sed 's/.*:\([0-9]*\)"/\1/'); curl -sk https://127.0.0.1:$p/metrics > $O/$L-m$n-a.txt; done
sleep 25
for n in 1 2 3; do p=$(grep http_listen $D/node-$n/twinhub.toml | sed 's/.*:\([0-9]*\)"/\1/'); curl -sk https://127.0.0.1:$p/metrics > $O/$L-m$n-b.txt; done
wait $P
grep -A1 ^system $O/$L.txt | tail -1
for n in 1 2 3; do echo node $n; python3 - $O/$L-m$n-a.txt $O/$L-m$n-b.txt <<'PY'
import sys
def load(f):
    d={}
    for l in open(f):
        if l.startswith('#') or not l.strip(): continue
        k,v=l.rsplit(' ',1)
        try: d[k]=float(v)
        except: pass
    return d
a=load(sys.argv[1]); b=load(sys.argv[2])
for k in sorted(b):
    if any(s in k for s in ('snapshot','fsync_seconds','leader_changes','compaction','flush','elections','term')):
        dv=b[k]-a.get(k,0)
        if dv: print(f'   {k[:100]:100s} {dv:14.3f}')
PY
done
