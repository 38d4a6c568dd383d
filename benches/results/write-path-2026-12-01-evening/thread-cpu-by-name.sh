#!/bin/bash
# twinhub-only compare; per-thread-name CPU across the 3 nodes over 15 s of the window, µs/update.
BD=$1; L=$2
W=/tmp/thr-$L; rm -rf $W; mkdir -p $W
TWINHUB_BIN=$BD/twinhub $BD/twinhub bench compare --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/c.json > $W/c.txt 2> $W/c.log &
B=$!
until grep -q "closed loop" $W/c.log 2>/dev/null; do kill -0 $B 2>/dev/null || { tail $W/c.log; exit 1; }; sleep 1; done
sleep 10
snap() { for p in $(pgrep -f "$BD/twinhub serve"); do for t in /proc/$p/task/*; do echo "$p $(cat $t/comm | tr ' ' '_') $(awk '{print $14+$15}' $t/stat)"; done; done; }
snap > $W/s0; S0=$(date +%s.%N); sleep 15; snap > $W/s1; S1=$(date +%s.%N)
wait $B
U=$(grep -E '^twinhub ' $W/c.txt | awk '{print $2}' | tr -d ,)
grep -E '^twinhub ' $W/c.txt
python3 - $W $U $S0 $S1 <<'PY'
import sys,collections,re
w,u,s0,s1=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4])
def load(f):
    d={}
    for l in open(f):
        p,c,t=l.split(); d[(p,c)]=d.get((p,c),0)+int(t)
    return d
a=load(w+'/s0'); b=load(w+'/s1')
upd=u*(s1-s0)
byname=collections.Counter(); tot=0
for k in b:
    dt=(b[k]-a.get(k,0))*10  # ms (HZ=100)
    name=re.sub(r'[-_]?\d+$','',k[1])
    byname[name]+=dt; tot+=dt
print(f"updates/s {u:.0f}; server CPU µs/update {tot/upd*1000:.1f}")
for k,v in byname.most_common(14): print(f"  {k:28s} {v/upd*1000:7.1f}")
PY
