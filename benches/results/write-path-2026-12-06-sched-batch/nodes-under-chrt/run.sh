#!/bin/bash
out=${1:?OUTDIR}; mkdir -p $out
B=/work/main/target/release
run() { v=$1; r=$2; case $v in main) bin=$B/twinhub;; tcpu) bin=/work/tcpu/release/twinhub;; bmain) bin="$(dirname "$0")/../nodes-under-chrt/batch-main";; btcpu) bin="$(dirname "$0")/../nodes-under-chrt/batch-tcpu";; esac
  $B/twinhub-bench compare --bin $bin --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$v-$r.json > $out/$v-$r.txt 2>&1
  echo "$v $r $(grep '^twinhub ' $out/$v-$r.txt)"; }
run bmain 1; run main 1; run btcpu 1; run tcpu 1
run tcpu 2; run btcpu 2; run main 2; run bmain 2
