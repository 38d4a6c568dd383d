#!/usr/bin/env bash
# ab.sh A_DIR B_DIR PAIRS: interleaved twinhub-only compares (A B, B A, ...), one line per run.
set -u
A=$1; B=$2; N=${3:-6}
run() { local dir=$1 label=$2
  TWINHUB_BIN=$dir/twinhub $dir/twinhub bench compare --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out /tmp/evab/$label.json >/tmp/evab/$label.txt 2>/tmp/evab/$label.log
  python3 -c "
import json;d=json.load(open('/tmp/evab/$label.json'))['twinhub'];c=d['cpu']
print('$label', round(d['updates_per_s']), 'p99', d['p99_ms'], 'cpu_ms/update', round(c['servers_cpu_ms_per_update'],3), 'notified', d['watch'].get('notifications'))"
}
for i in $(seq 1 $N); do
  if [ $((i % 2)) -eq 1 ]; then run $A before-$i; run $B after-$i; else run $B after-$i; run $A before-$i; fi
done
