#!/bin/bash
# ab.sh BINDIR OUTDIR LABEL [VAR=VALUE...]: one twinhub-only closed-loop compare of the build in BINDIR
# (twinhub and twinhub-bench), with the given environment; writes OUTDIR/LABEL.{txt,json,err} and
# prints the twinhub row. The pairs of this directory ran as
#   for r in 1 2; do ab.sh B O def$r; ab.sh B O w1-$r TWINHUB_BENCH_NODE_WORKER_THREADS=1; done
#   for r in 3 4 5; do ab.sh B O w1-$r TWINHUB_BENCH_NODE_WORKER_THREADS=1; ab.sh B O def$r; done
B=$1; O=$2; label=$3; shift 3
mkdir -p "$O"
env "$@" "$B/twinhub-bench" compare --bin "$B/twinhub" --systems twinhub --duration 30 --concurrency 64 \
  --twins 10000 --value-bytes 200 --out "$O/$label.json" > "$O/$label.txt" 2> "$O/$label.err"
grep -A1 "^system" "$O/$label.txt" | tail -1 | sed "s/^/$label /"
