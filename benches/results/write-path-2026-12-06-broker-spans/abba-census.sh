#!/bin/bash
# usage: abba-census.sh OUTDIR ORDER  (A = /tmp/ab/A/twinhub, B = /tmp/ab/B/twinhub); per-thread CPU census over 12 s of each run
out=$1; order=$2; mkdir -p $out
cd /work/main
snap=benches/results/write-path-2026-12-06-sched-batch/census/snap.py
i=0
for x in $(echo $order | grep -o .); do
  i=$((i+1))
  bin=/tmp/ab/$x/twinhub
  target/release/twinhub-bench compare --bin $bin --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$i-$x.json > $out/$i-$x.txt 2>$out/$i-$x.err &
  b=$!
  # the measured window starts after the populate and warm-up; census in its middle
  while ! grep -q "s .*ops/s" $out/$i-$x.err 2>/dev/null; do sleep 0.5; done
  sleep 10; python3 $snap 12 > $out/$i-$x.census.txt
  wait $b
  python3 -c "
import json,re;d=json.load(open('$out/$i-$x.json'))['twinhub'];c=d['cpu']
r=[l for l in open('$out/$i-$x.census.txt') if ' router ' in l or ' router-' in l or 'router ' in l]
print('$i $x', d['updates_per_s'], c['servers_cpu_ms_per_update'], d['p99_ms'], ' | '.join(l.split('cpu%')[1].strip() for l in r))" | tee -a $out/summary.txt
done
