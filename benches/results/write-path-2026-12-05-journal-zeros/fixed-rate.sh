#!/bin/bash
# fixed.sh: warm 15 s closed loop, then 30 s at 8,000 updates/s; server CPU per update from /proc, fsync count/mean/slow from /metrics
O=/tmp/fjz2/fixed; mkdir -p $O
one() { # label bindir
  D=/tmp/fjz2/clf; rm -rf $D; $2/twinhub cluster up --dir $D > /dev/null 2>&1
  $2/twinhub-bench run --cluster $D/cluster.json --devices 0 --twins 10000 --concurrency 64 --mix patch=100 --value-bytes 200 --duration 15 --out $O/$1-warm.json > /dev/null 2>&1
  PIDS=$(grep -o '"pid": [0-9]*' $D/cluster.json | awk '{print $2}')
  PORTS=$(grep -o '"http": "127.0.0.1:[0-9]*' $D/cluster.json | cut -d: -f3)
  fsm() { for p in $PORTS; do curl -sk https://127.0.0.1:$p/metrics | awk '/^twinhub_storage_fsync_seconds_count/{c=$2} /^twinhub_storage_fsync_seconds_sum/{s=$2} /twinhub_storage_fsync_seconds_bucket\{le="0.001"\}/{f=$2} END{printf "%s %s %s ", c, s, c-f}'; done; }
  cpu() { t=0; for p in $PIDS; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
  f0=$(fsm); c0=$(cpu)
  $2/twinhub-bench run --cluster $D/cluster.json --devices 0 --twins 10000 --rate 8000 --concurrency 64 --mix patch=100 --value-bytes 200 --duration 30 --out $O/$1.json > $O/$1.txt 2> $O/$1.err
  c1=$(cpu); f1=$(fsm)
  $2/twinhub cluster down --dir $D > /dev/null 2>&1
  python3 - "$1" "$c0" "$c1" "$f0" "$f1" $O/$1.txt <<'PY'
import sys
lab,c0,c1=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]); f0=list(map(float,sys.argv[4].split())); f1=list(map(float,sys.argv[5].split()))
l=[x for x in open(sys.argv[6]) if x.startswith('patch')][0].split()
ops=int(l[1]); 
out=[]
for i in range(3):
    c=f1[3*i]-f0[3*i]; s=f1[3*i+1]-f0[3*i+1]; sl=f1[3*i+2]-f0[3*i+2]
    out.append('%d fsyncs mean %.0f us >1ms %d'%(c,s/c*1e6,sl))
print(lab,'ops',ops,'rate %.0f'%float(l[3]),'p50',l[4],'p99',l[6],'server CPU ms/update %.4f'%((c1-c0)*10/ops),' | '.join(out))
PY
}
for r in a b c; do one ahead-$r /tmp/fjz2; one base-$r /tmp/base-bin; done
