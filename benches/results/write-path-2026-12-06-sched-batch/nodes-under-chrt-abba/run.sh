#!/bin/bash
out=${1:?OUTDIR}; mkdir -p $out
B=/work/main/target/release
run() { v=$1; r=$2; case $v in main) bin=$B/twinhub;; tcpu) bin=/work/tcpu/release/twinhub;; bmain) bin="$(dirname "$0")/../nodes-under-chrt/batch-main";; btcpu) bin="$(dirname "$0")/../nodes-under-chrt/batch-tcpu";; esac
  $B/twinhub-bench compare --bin $bin --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$v-$r.json > $out/$v-$r.txt 2>&1
  python3 -c "
import json;d=json.load(open('$out/$v-$r.json'))['twinhub'];c=d['cpu'];print('$v $r', round(d['updates_per_s']), c['servers_cpu_ms_per_update'], c['client_cpu_ms_per_update'], round(c['servers_cores_busy']+c['client_cores_busy'],2), d['p99_ms'])"; }
i=0
for v in main bmain bmain main main bmain bmain main main bmain bmain main; do i=$((i+1)); run $v $i; done
