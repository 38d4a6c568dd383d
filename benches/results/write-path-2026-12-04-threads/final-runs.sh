#!/bin/bash
# final-runs.sh BINDIR OUTDIR: the two compares and two latency sweeps of a build, with the disk's
# pressure (/proc/pressure/io) recorded before and after each.
B=$1; O=$2; mkdir -p "$O"
bench() { "$B/twinhub-bench" "$@"; }
cat /proc/pressure/io > "$O/pressure-before.txt"
bench compare --bin "$B/twinhub" --systems twinhub,etcd,nats,nats-nofsync --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out "$O/compare-1.json" > "$O/compare-1.txt" 2> "$O/compare-1.err"
cat /proc/pressure/io > "$O/pressure-after-compare-1.txt"
bench compare --bin "$B/twinhub" --systems etcd,nats,twinhub,nats-nofsync --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out "$O/compare-2.json" > "$O/compare-2.txt" 2> "$O/compare-2.err"
cat /proc/pressure/io > "$O/pressure-after-compare-2.txt"
for i in 1 2; do
  bench latency-sweep --bin "$B/twinhub" --duration 20 --out "$O/latency-sweep-$i.json" > "$O/latency-sweep-$i.txt" 2> "$O/latency-sweep-$i.err"
  cat /proc/pressure/io > "$O/pressure-after-sweep-$i.txt"
done
