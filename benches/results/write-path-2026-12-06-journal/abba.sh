#!/bin/bash
# usage: abba.sh OUTDIR ORDER  (A = /tmp/ab/A/twinhub, B = /tmp/ab/B/twinhub)
out=$1; order=$2; mkdir -p $out
cd /work/main
i=0
for x in $(echo $order | grep -o .); do
  i=$((i+1))
  bin=/tmp/ab/$x/twinhub
  target/release/twinhub-bench compare --bin $bin --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$i-$x.json > $out/$i-$x.txt 2>$out/$i-$x.err
  python3 -c "
import json;d=json.load(open('$out/$i-$x.json'))['twinhub'];c=d['cpu']
print('$i $x', d['updates_per_s'], c['servers_cpu_ms_per_update'], d['p99_ms'], d.get('disk_mb'))" | tee -a $out/summary.txt
done
python3 - $out <<'PY'
import sys,collections
r=collections.defaultdict(list)
for l in open(sys.argv[1]+'/summary.txt'):
    i,x,u,c,p,dk=l.split()
    r[x].append((float(u),float(c),float(p)))
for x,v in sorted(r.items()):
    n=len(v); print(x, n, 'upd/s %.0f'%(sum(a for a,_,_ in v)/n), 'cpu %.4f'%(sum(b for _,b,_ in v)/n), 'p99 %.2f'%(sum(c for _,_,c in v)/n))
PY
