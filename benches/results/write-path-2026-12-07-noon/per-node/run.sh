#!/bin/bash
# [C=N] run.sh OUTDIR [compare options]: a twinhub-only compare of N workers (else 64), and each thread's CPU time and switches over 12 s of its window summed per node and thread name (the census snap.py of 2026-12-06 with BY=node). Run from the repository root; BIN=path picks the twinhub binary; the environment (TWINHUB_BENCH_CLIENTS_ON_NODE=N, a prototype's variable) reaches the nodes.
W=$1; shift; rm -rf $W; mkdir -p $W
(TWINHUB_BIN=${BIN:-target/release/twinhub} ${BIN:-target/release/twinhub} bench compare --systems twinhub --duration 30 --concurrency ${C:-64} --twins 10000 --value-bytes 200 "$@" --out $W/c.json > $W/c.txt 2> $W/c.log &)
sleep 2
until grep -q "closed loop" $W/c.log 2>/dev/null; do sleep 1; done; sleep 8
BY=node python3 benches/results/write-path-2026-12-06-sched-batch/census/snap.py 12 > $W/snap.txt
while pgrep -f "twinhub-bench compare" >/dev/null; do sleep 2; done
cat $W/snap.txt; grep -E "^twinhub " $W/c.txt
