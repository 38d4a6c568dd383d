#!/bin/bash
# ab.sh BINDIR OUTDIR PAIRS: twinhub-only compares (ab.sh of write-path-2026-12-04-threads), the nodes'
# group-commit writer threads at nice -10 (p, renice.sh beside this file) against the default (d), same
# binary, ABBA order.
B=${1:?BINDIR}; O=${2:?OUTDIR}; N=${3:-3}; here=$(dirname "$0"); ab=$here/../../write-path-2026-12-04-threads/ab.sh
run_p() { "$here/renice.sh" -10 & r=$!; $ab $B $O p$1; kill $r; }
run_d() { $ab $B $O d$1; }
for i in $(seq 1 $N); do
  if [ $((i % 2)) = 1 ]; then run_p $i; run_d $i; else run_d $i; run_p $i; fi
done
