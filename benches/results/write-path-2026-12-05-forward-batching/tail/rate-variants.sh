#!/bin/bash
# ab.sh: 30 s at 6,800 updates/s (half the closed loop's maximum) on a fresh cluster per run, by variant:
# EXP_FJALL_NICE and EXP_LOG_MEMTABLE_MB were read by a throwaway build only (the nice value given to fjall's threads when the database opens, and the base of the log memtable size); main has neither
# fjall's background threads' nice value (EXP_FJALL_NICE) and the log memtable's base size (EXP_LOG_MEMTABLE_MB)
B=/tmp/exp; O=/tmp/exp/out; mkdir -p $O
one() { # label nice memtable_mb
  rm -rf $B/cl
  EXP_FJALL_NICE=$2 EXP_LOG_MEMTABLE_MB=$3 $B/twinhub cluster up --dir $B/cl > /dev/null 2>&1
  $B/twinhub-bench run --cluster $B/cl/cluster.json --devices 0 --twins 10000 --rate 6800 --concurrency 64 --mix patch=100 --value-bytes 200 --duration 30 --out $O/$1.json > $O/$1.txt 2> $O/$1.err
  slow=""
  for p in $(grep -o '"http": "127.0.0.1:[0-9]*' $B/cl/cluster.json | cut -d: -f3); do
    m=$(curl -sk https://127.0.0.1:$p/metrics)
    c=$(echo "$m" | grep '^twinhub_storage_write_seconds_count' | awk '{print $2}')
    f=$(echo "$m" | grep 'twinhub_storage_write_seconds_bucket{le="0.01"}' | awk '{print $2}')
    slow="$slow $((c-f))"
  done
  $B/twinhub cluster down --dir $B/cl > /dev/null 2>&1
  echo "$1 nice=$2 mem=$3 $(grep '^patch' $O/$1.txt | awk '{print "ops/s",$4,"p50",$5,"p90",$6,"p99",$7,"p99.9",$8}') group-commit writes over 10 ms per node:$slow"
}
one base-a 10 16; one nice0-a 0 16; one mem64-a 10 64; one both-a 0 64
one base-b 10 16; one nice0-b 0 16; one mem64-b 10 64; one both-b 0 64
