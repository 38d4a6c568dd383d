#!/bin/bash
# A/B/C interleaved: main, target-cpu=native, main under SCHED_BATCH
out=${1:?OUTDIR}; mkdir -p $out
B=/work/main/target/release
for r in 1 2 3; do
  for v in main tcpu batch; do
    case $v in
      main) bin=$B/twinhub; pre="";;
      tcpu) bin=/work/tcpu/release/twinhub; pre="";;
      batch) bin=$B/twinhub; pre="chrt -b 0";;
    esac
    $pre $B/twinhub-bench compare --bin $bin --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$v-$r.json > $out/$v-$r.txt 2>&1
    echo "$v $r $(grep '^twinhub ' $out/$v-$r.txt)"
  done
done
