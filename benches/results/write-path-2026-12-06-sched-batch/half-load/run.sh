#!/bin/bash
out=${1:?OUTDIR}; mkdir -p $out
B=/work/main/target/release
i=0
for v in bmain main main bmain bmain main; do i=$((i+1))
  case $v in main) bin=$B/twinhub;; bmain) bin="$(dirname "$0")/../nodes-under-chrt/batch-main";; esac
  $B/twinhub-bench latency-sweep --bin $bin --percents 50 --duration 20 --out $out/$v-$i.json > $out/$v-$i.txt 2>&1
  echo "$v $i $(grep -E "closed|50 ?%" $out/$v-$i.txt | tr '\n' ' ' | cut -c1-300)"
done
