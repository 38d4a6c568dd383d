#!/bin/bash
# ABBA: the same source (the SCHED_BATCH commit) built for the baseline x86-64 and for x86-64-v3.
out=${1:?OUTDIR}; mkdir -p $out
B=/work/main/target/release
i=0
for v in base v3 v3 base base v3 v3 base base v3 v3 base; do i=$((i+1))
  if [ $v = base ]; then bin=$B/twinhub; else bin=/work/tv3/release/twinhub; fi
  $B/twinhub-bench compare --bin $bin --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$v-$i.json > $out/$v-$i.txt 2>&1
  python3 -c "
import json;d=json.load(open('$out/$v-$i.json'))['twinhub'];c=d['cpu'];print('$v $i', round(d['updates_per_s']), c['servers_cpu_ms_per_update'], c['client_cpu_ms_per_update'], round(c['servers_cores_busy']+c['client_cores_busy'],2), d['p99_ms'])"
done
