#!/bin/bash
# One twinhub-only compare (with its change watch) and the CPU of every thread of the three nodes over
# 15 s of its window, read from /proc, per acknowledged update; node 1 (the watch's broker) by thread name.
#   [TWINHUB_BENCH_NODE_OPTIONS=events_batch_ms=0] thread-cpu-run.sh DIR-WITH-twinhub-AND-twinhub-bench LABEL
BD=$1; L=$2
W=/tmp/thr-$L; rm -rf $W; mkdir -p $W
TWINHUB_BIN=$BD/twinhub $BD/twinhub bench compare --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/c.json > $W/c.txt 2> $W/c.log &
B=$!
until grep -q "closed loop" $W/c.log 2>/dev/null; do kill -0 $B 2>/dev/null || { tail $W/c.log; exit 1; }; sleep 1; done
sleep 10
snap() { for p in $(pgrep -f "$BD/twinhub serve"); do for t in /proc/$p/task/*; do echo "$p $(cat $t/comm | tr ' ' '_') $(awk '{print $14+$15}' $t/stat)"; done; done; }
snap > $W/s0; S0=$(date +%s.%N); sleep 15; snap > $W/s1; S1=$(date +%s.%N)
N1=$(pgrep -f "$BD/twinhub serve.*node-1/")
wait $B
U=$(grep -E '^twinhub ' $W/c.txt | awk '{print $2}')
python3 - $W $U $S0 $S1 $N1 <<'PY'
import sys,collections
w,u,s0,s1,n1=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4]),sys.argv[5]
def load(f):
    d={}
    for l in open(f):
        p,c,t=l.split(); d.setdefault((p,c),[]).append(int(t))
    return {k:sum(v) for k,v in d.items()}
a=load(w+'/s0'); b=load(w+'/s1')
hz=100; upd=u*(s1-s0)
node=collections.Counter(); n1c=collections.Counter()
for k in b:
    dt=(b[k]-a.get(k,0))/hz*1000  # ms
    node[k[0]]+=dt
    if k[0]==n1: n1c[k[1]]+=dt
print(f"updates/s {u:.0f}; server CPU µs/update (3 nodes, /proc) {sum(node.values())/upd*1000:.1f}; per node " + " ".join(f"{v/upd*1000:.1f}" for k,v in sorted(node.items())))
print("node 1 by thread, µs/update:", ', '.join(f"{k} {v/upd*1000:.1f}" for k,v in n1c.most_common(8)))
PY
