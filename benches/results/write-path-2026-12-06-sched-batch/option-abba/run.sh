#!/bin/bash
out=${1:?OUTDIR}; mkdir -p $out
B=/work/main/target/release
i=0
for v in normal batch batch normal normal batch batch normal normal batch batch normal; do i=$((i+1))
  if [ $v = normal ]; then export TWINHUB_BENCH_NODE_OPTIONS='cpu_scheduling="normal"'; else unset TWINHUB_BENCH_NODE_OPTIONS; fi
  $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$v-$i.json > $out/$v-$i.txt 2>&1 &
  bp=$!
  for k in $(seq 90); do grep -q "closed loop" $out/$v-$i.txt 2>/dev/null && break; sleep 1; done
  sleep 8; python3 "$(dirname "$0")/../census/snap.py" 12 > $out/$v-$i.cs.txt
  policy=$(for p in $(pgrep -x twinhub); do awk '{print $41}' /proc/$p/stat; done | sort | uniq -c | tr '\n' ' ')
  wait $bp
  python3 -c "
import json;d=json.load(open('$out/$v-$i.json'))['twinhub'];c=d['cpu'];print('$v $i', round(d['updates_per_s']), c['servers_cpu_ms_per_update'], c['client_cpu_ms_per_update'], round(c['servers_cores_busy']+c['client_cores_busy'],2), d['p99_ms'], 'policy: $policy', open('$out/$v-$i.cs.txt').readline().strip())"
done
