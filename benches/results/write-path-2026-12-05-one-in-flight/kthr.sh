#!/bin/bash
# kthr.sh BINDIR OUT [ENV...]: per-process CPU (all processes incl. kernel threads) over 15 s of a twinhub-only window
B=$1; O=$2
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O.json > $O.txt 2> $O.log &
P=$!
until grep -q "closed loop" $O.log 2>/dev/null; do sleep 1; done
snap() { for t in /proc/[0-9]*/task/[0-9]*; do s=$(cat $t/stat 2>/dev/null) || continue; echo "$t ${s#*) }" | awk -v c="$(cat $t/comm 2>/dev/null)" '{print $1, c, $13+$14}'; done; }
sleep 8; snap > $O.a; sleep 15; snap > $O.b
wait $P
grep -E '^twinhub ' $O.txt
U=$(grep -E '^twinhub ' $O.txt | awk '{print $2*15}')
python3 - $O.a $O.b $U <<'PY'
import sys,collections,re
def rd(f):
    d={}
    for l in open(f):
        x=l.split()
        if len(x)<3: continue
        d[x[0]]=(' '.join(x[1:-1]),int(x[-1]))
    return d
a=rd(sys.argv[1]);b=rd(sys.argv[2]);u=float(sys.argv[3])
agg=collections.Counter()
for k,(c,t) in b.items():
    if k in a: agg[re.sub(r'[/:-]?\d+([:/-]\d+)*$','',c)]+=t-a[k][1]
tot=sum(agg.values())
print("total %.1f us/update (%.0f%% of 2 cores)"%(tot*10000/u, tot/15/2))
for k,v in agg.most_common(25): print("%7.2f us/u  %s"%(v*10000/u,k))
PY
