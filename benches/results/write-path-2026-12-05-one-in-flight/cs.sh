#!/bin/bash
# cs.sh BINDIR OUT: twinhub-only compare; per-thread context switches over 15 s of the window
B=$1; O=$2
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O.json > $O.txt 2> $O.log &
P=$!
until grep -q "closed loop" $O.log 2>/dev/null; do sleep 1; done
snap() { for p in $(pgrep -f "twinhub"); do for t in /proc/$p/task/*; do c=$(cat $t/comm 2>/dev/null); v=$(awk '/^voluntary_ctxt/{print $2}' $t/status 2>/dev/null); n=$(awk '/^nonvoluntary_ctxt/{print $2}' $t/status 2>/dev/null); s=$(awk '{print $14+$15}' $t/stat 2>/dev/null); echo "$p $(basename $t) $(cat /proc/$p/comm) $c $v $n $s"; done; done; }
sleep 10; snap > $O.s1; sleep 15; snap > $O.s2
wait $P
grep -E '^twinhub ' $O.txt
python3 - $O.s1 $O.s2 $O.txt <<'PY'
import sys,collections,re
def rd(f):
    d={}
    for l in open(f):
        x=l.split()
        if len(x)<7: continue
        d[(x[0],x[1])]=(x[2],x[3],int(x[4]),int(x[5]),int(x[6]))
    return d
a=rd(sys.argv[1]);b=rd(sys.argv[2])
ups=float([l for l in open(sys.argv[3]) if l.startswith('twinhub ')][0].split()[1])*15
agg=collections.defaultdict(lambda:[0,0,0])
for k,v in b.items():
    if k not in a: continue
    u=a[k]; name=v[0]+':'+re.sub(r'[-_ ]?\d+$','',v[1])
    agg[name][0]+=v[2]-u[2];agg[name][1]+=v[3]-u[3];agg[name][2]+=v[4]-u[4]
tv=tn=0
for k,(vv,nn,t) in sorted(agg.items(),key=lambda x:-(x[1][0]+x[1][1])):
    tv+=vv;tn+=nn
    print("%-40s vol/u %.3f invol/u %.3f cpu_us/u %.1f"%(k,vv/ups,nn/ups,t*10000/ups))
print("total vol/u %.3f invol/u %.3f"%(tv/ups,tn/ups))
PY
