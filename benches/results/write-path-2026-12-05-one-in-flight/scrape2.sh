#!/bin/bash
# scrape2.sh BINDIR LABEL [CONC]: histogram means (sum/count delta) over 25 s of the window, per node
B=$1; L=$2; C=${3:-64}; O=/tmp/big
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency $C --twins 10000 --value-bytes 200 --out $O/$L.json > $O/$L.txt 2> $O/$L.err &
P=$!
until grep -q "closed loop" $O/$L.err 2>/dev/null; do kill -0 $P 2>/dev/null || break; sleep 0.5; done
sleep 4
D=$(ps -eo args | grep "$B/twinhub serve" | grep -v grep | head -1 | sed 's/.*--config \(.*\)\/node-1.*/\1/')
for n in 1 2 3; do p=$(grep http_listen $D/node-$n/twinhub.toml | sed 's/.*:\([0-9]*\)"/\1/'); curl -sk https://127.0.0.1:$p/metrics > $O/$L-m$n-a.txt; done
sleep 25
for n in 1 2 3; do p=$(grep http_listen $D/node-$n/twinhub.toml | sed 's/.*:\([0-9]*\)"/\1/'); curl -sk https://127.0.0.1:$p/metrics > $O/$L-m$n-b.txt; done
wait $P
grep -E "^twinhub " $O/$L.txt
for n in 1 2 3; do echo node $n; python3 - $O/$L-m$n-a.txt $O/$L-m$n-b.txt <<'PY'
import sys,re
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
    if k.split('{')[0].endswith('_sum'):
        ck=k.replace('_sum','_count',1)
        dc=b.get(ck,0)-a.get(ck,0); ds=b[k]-a.get(k,0)
        if dc>0: print(f'   {k[:110]:110s} n/s {dc/25:9.1f} mean {ds/dc*(1000 if "seconds" in k else 1):9.3f}{" ms" if "seconds" in k else ""}')
PY
done
