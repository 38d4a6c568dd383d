#!/bin/bash
# abba.sh A_DIR B_DIR OUT PAIRS: PAIRS pairs of twinhub-only closed-loop compares (ab.sh of
# ../write-path-2026-12-04-threads: `twinhub bench compare --systems twinhub --duration 30
# --concurrency 64 --twins 10000 --value-bytes 200`), build A against build B, in ABBA order (odd pairs
# A first, even pairs B first), so that a drift of the machine over the series favours neither.
# Each DIR holds `twinhub` and `twinhub-bench`; to compare servers only, put the same twinhub-bench in
# both. Prints one row per run, labelled aN / bN.
A=$1; B=$2; O=$3; N=$4; mkdir -p "$O"
ab=$(dirname "$0")/../write-path-2026-12-04-threads/ab.sh
for i in $(seq 1 "$N"); do
  if [ $((i % 2)) = 1 ]; then "$ab" "$A" "$O" a$i; "$ab" "$B" "$O" b$i; else "$ab" "$B" "$O" b$i; "$ab" "$A" "$O" a$i; fi
done
