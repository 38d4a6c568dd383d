#!/bin/bash
# Context switches of the three nodes by thread name (voluntary, involuntary) and CPU, over 10 s of PATCH load
#   [SC=8] [RATE=R] [CLIENT=twinhub-bench] switches-by-thread.sh BIN LABEL [node-option ...]   (closed loop without RATE)
BIN=$1; L=$2; shift 2
D=/tmp/cs-$L; rm -rf $D
OPTS=""; for o in "$@"; do OPTS="$OPTS --node-option $o"; done
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-8} --dir $D $OPTS >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/" | tr '\n' ' ')
timeout 300 ${CLIENT:-twinhub-bench} run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 ${RATE:+--rate $RATE} --duration 25 --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!
sleep 12
snap() { for p in $PIDS; do for t in /proc/$p/task/*; do n=$(cat $t/comm); v=$(awk '/^voluntary_ctxt/{print $2}' $t/status); nv=$(awk '/^nonvoluntary_ctxt/{print $2}' $t/status); c=$(awk '{print $14+$15}' $t/stat); echo "$p:${t##*/} $n $v $nv $c"; done; done; }
snap > $D/s0; sleep 10; snap > $D/s1
wait $B
grep '^patch' $D/run.txt
python3 - $D/s0 $D/s1 <<'PY'
import sys,collections
def rd(f):
    d={}
    for l in open(f):
        k,n,v,nv,c=l.split(); d[k]=(n,int(v),int(nv),int(c))
    return d
a,b=rd(sys.argv[1]),rd(sys.argv[2])
agg=collections.defaultdict(lambda:[0,0,0,0])
for k,(n,v,nv,c) in b.items():
    v0,nv0,c0=(a[k][1],a[k][2],a[k][3]) if k in a else (0,0,0)
    g=agg[n]; g[0]+=v-v0; g[1]+=nv-nv0; g[2]+=c-c0; g[3]+=1
tot=sum(g[0]+g[1] for g in agg.values())
print("total switches/s", tot/10)
for n,g in sorted(agg.items(), key=lambda x:-(x[1][0]+x[1][1])):
    print(f"{n:20} threads={g[3]:3} vol/s={g[0]/10:8.0f} invol/s={g[1]/10:7.0f} cpu%_of_a_core={g[2]/10:5.1f}")
PY
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
