#!/bin/bash
# The command with the machine's DAMON proactive reclaim (kdamond 0, "pageout" of regions cold for
# a few seconds) running and paused, alternated; the kernel's refault and major-fault counters around each run.
# Leaves kdamond 0 running at the end. Usage: abab.sh BINDIR OUTDIR PAIRS [ORDER ("on off") [FIRST_INDEX]]
B=${1:?BINDIR}; out=${2:?OUTDIR}; pairs=${3:-2}; order=${4:-on off}; first=${5:-0}; mkdir -p $out
K=/sys/kernel/mm/damon/admin/kdamonds/0
counters() { echo update_schemes_stats > $K/state 2>/dev/null
  echo "$(grep -E '^(workingset_refault_file|pgmajfault|pgpgin) ' /proc/vmstat | paste -sd' ') damon_sz_applied $(cat $K/contexts/0/schemes/0/stats/sz_applied 2>/dev/null || echo 0)"; }
i=$first
for p in $(seq 1 $pairs); do for st in $order; do i=$((i+1))
  echo $st > $K/state
  echo "before $(counters)" > $out/$st-$i.counters
  $B/twinhub bench compare --bin $B/twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $out/$st-$i.json > $out/$st-$i.txt 2>&1
  echo "after $(counters)" >> $out/$st-$i.counters
  echo "$st $i $(grep -E '^(twinhub|etcd|nats) ' $out/$st-$i.txt | grep -v nofsync | awk '{print $1, $2, $10}' | tr '\n' ' ')"
done; done
echo on > $K/state
