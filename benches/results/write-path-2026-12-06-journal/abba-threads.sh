#!/bin/bash
# usage: abba.sh OUTDIR PATTERN ORDER(e.g. ABBAABBA)   B = threads matching PATTERN in SCHED_BATCH
out=$1; pat=$2; order=$3; mkdir -p $out
cd /work/main
i=0
for x in $(echo $order | grep -o .); do
  i=$((i+1))
  w=""
  if [ $x = B ]; then /tmp/selb/watch.sh "$pat" & w=$!; fi
  target/release/twinhub-bench compare --bin target/release/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$i-$x.json > $out/$i-$x.txt 2>$out/$i-$x.err
  [ -n "$w" ] && kill $w
  python3 -c "
import json;d=json.load(open('$out/$i-$x.json'))['twinhub'];c=d['cpu']
print('$i $x', d['updates_per_s'], c['servers_cpu_ms_per_update'], d['p99_ms'])" | tee -a $out/summary.txt
done
