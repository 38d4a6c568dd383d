#!/bin/bash
# PATCH load on a fresh 3-node cluster; node 1's group-commit metrics (fsyncs, rounds, requests per round) and
# the three nodes' server CPU per update over WIN s (default 10) after WARM s (default 12), and the client's CPU
# over the same window; at the end, per node: bytes written to the block layer, CPU of fjall's threads and of the
# whole process (the window's settings and those counters were added on 2026-11-29, late; the defaults run
# as before).
#   [SC=8] [RATE=R] [DUR=25] [WARM=12] [WIN=10] [UPOPTS="cluster up flags"] [CLIENT=twinhub-bench] group-commit-run.sh BIN LABEL [node-option ...]
BIN=$1; L=$2; shift 2
D=/tmp/gc-$L; rm -rf $D
OPTS=""; for o in "$@"; do OPTS="$OPTS --node-option $o"; done
timeout 60 $BIN cluster up --nodes 3 --shard-count ${SC:-8} --dir $D $OPTS $UPOPTS >/dev/null 2>&1 || { echo "cluster up failed"; exit 1; }
PIDS=$(pgrep -f "twinhub serve.*$D/" | tr '\n' ' ')
timeout 300 ${CLIENT:-twinhub-bench} run --cluster $D/cluster.json --devices 0 --twins 10000 --mix patch=100 --concurrency 64 ${RATE:+--rate $RATE} --duration ${DUR:-25} --out $D/run.json > $D/run.txt 2>$D/run.log &
B=$!; sleep 1; CP=$(pgrep -x twinhub-bench | head -1)
sleep ${WARM:-12}
H1=$(python3 -c "import json;print(json.load(open('$D/cluster.json'))['nodes'][0]['http'])")
curl -sk https://$H1/metrics > $D/m0
k0=$(awk '{print $14+$15}' /proc/$CP/stat); c0=0; for p in $PIDS; do c0=$((c0+$(awk '{print $14+$15}' /proc/$p/stat))); done
sleep ${WIN:-10}
k1=$(awk '{print $14+$15}' /proc/$CP/stat); echo "client cpu cores: $((k1-k0))cs/10s"; c1=0; for p in $PIDS; do c1=$((c1+$(awk '{print $14+$15}' /proc/$p/stat))); done
curl -sk https://$H1/metrics > $D/m1
wait $B
line=$(grep '^patch' $D/run.txt); rate=$(echo $line | awk '{print $4}')
python3 - $D/m0 $D/m1 "$L" "$line" $((c1-c0)) $rate <<'PY'
import sys,os
W=float(os.environ.get("WIN","10"))
def rd(f):
    d={}
    for l in open(f):
        if l.startswith('#') or not l.strip(): continue
        k,v=l.rsplit(' ',1)
        try: d[k]=float(v)
        except: pass
    return d
a,b=rd(sys.argv[1]),rd(sys.argv[2])
def dl(k): return b.get(k,0)-a.get(k,0)
fs=dl('twinhub_storage_fsync_seconds_count'); ft=dl('twinhub_storage_fsync_seconds_sum')
bc=dl('twinhub_storage_batch_requests_count'); bs=dl('twinhub_storage_batch_requests_sum')
rate=float(sys.argv[6]); cpu=int(sys.argv[5])
print(f"{sys.argv[3]} {sys.argv[4]} | cpu_ms/u={cpu*10/W/rate:.3f} node1 fsync/s={fs/W:.0f} fsync_ms={ft/max(fs,1)*1000:.3f} rounds/s={bc/W:.0f} reqs/round={bs/max(bc,1):.2f}")
PY
for p in $PIDS; do echo "io $p $(grep -E "^write_bytes" /proc/$p/io) fjall_cs $(cat /proc/$p/task/*/stat 2>/dev/null | grep "(fjall" | awk '{s+=$14+$15} END {print s}') total_cs $(awk '{print $14+$15}' /proc/$p/stat)"; done
timeout 30 $BIN cluster down --dir $D >/dev/null 2>&1 || pkill -f "twinhub serve.*$D/"
