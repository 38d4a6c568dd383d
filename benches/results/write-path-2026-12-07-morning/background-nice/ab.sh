#!/bin/bash
# ab.sh BINDIR OUTDIR PAIRS: half-load sweeps (`latency-sweep --percents 50 --duration 30`), alternately with
# the nodes' storage background threads (fjall's workers, the snapshot writer) reniced to +10 while the
# sweep runs, and as they are; order alternated by pair. They already run at nice 10 (the nodes set it), so
# this measured the renicing loop's own CPU beside the cluster instead (benches/README.md).
B=${1:?BINDIR}; out=${2:?OUTDIR}; n=${3:?PAIRS}; mkdir -p $out
renicer() { while true; do
  for p in $(pgrep -f "$B/twinhub serve"); do for t in /proc/$p/task/*; do
    c=$(cat $t/comm 2>/dev/null); case "$c" in fjall:worker*|raft-snapshots*) renice -n 10 -p $(basename $t) >/dev/null 2>&1;; esac
  done; done; sleep 0.5; done; }
i=0
for r in $(seq 1 $n); do
  if [ $((r % 2)) = 1 ]; then order="nice plain"; else order="plain nice"; fi
  for mode in $order; do
    i=$((i+1)); rp=
    if [ $mode = nice ]; then renicer & rp=$!; fi
    $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 50 --duration 30 --out $out/sweep-$i.json > $out/sweep-$i.txt 2> $out/sweep-$i.err
    [ -n "$rp" ] && kill $rp
    echo "$i $(date +%T) 50% $(grep -E '^50% ' $out/sweep-$i.txt | tr -s ' ' | cut -d' ' -f2-) mode $mode" | tee -a $out/marks.txt
  done
done
