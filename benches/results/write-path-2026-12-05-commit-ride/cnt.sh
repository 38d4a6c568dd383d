#!/bin/bash
# cnt.sh BINDIR LABEL [OUTDIR]: counters of appends per second over 20 s of the window, per node
B=$1; L=$2; O=${3:-/tmp/big}; mkdir -p $O
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/$L.json > $O/$L.txt 2> $O/$L.err &
P=$!
until grep -q "closed loop" $O/$L.err 2>/dev/null; do kill -0 $P 2>/dev/null || break; sleep 0.5; done
sleep 4
D=$(ps -eo args | grep "$B/twinhub serve" | grep -v grep | head -1 | sed 's/.*--config \(.*\)\/node-1.*/\1/')
for n in 1 2 3; do p=$(grep http_listen $D/node-$n/twinhub.toml | sed 's/.*:\([0-9]*\)"/\1/'); curl -sk https://127.0.0.1:$p/metrics > $O/$L-c$n-a.txt; done
sleep 20
for n in 1 2 3; do p=$(grep http_listen $D/node-$n/twinhub.toml | sed 's/.*:\([0-9]*\)"/\1/'); curl -sk https://127.0.0.1:$p/metrics > $O/$L-c$n-b.txt; done
wait $P
grep -E "^twinhub " $O/$L.txt
for n in 1 2 3; do echo node $n; python3 - $O/$L-c$n-a.txt $O/$L-c$n-b.txt <<'PY'
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
    if ('appends_sent' in k or 'commits_carried' in k or 'entries_sent' in k or 'fsync' in k) and not k.split('{')[0].endswith(('_sum','_bucket')):
        d=b[k]-a.get(k,0)
        if d>0: print(f'   {k[:100]:100s} {d/20:9.1f}/s')
PY
done
