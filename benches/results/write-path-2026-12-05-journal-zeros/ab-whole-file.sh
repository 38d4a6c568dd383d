#!/bin/bash
# ab.sh: the whole 64 MiB journal written with zeros when fjall creates it (a throwaway build: whole-file-zero-fill.patch on fjall 3.1.13, B=/tmp/fjz) vs as released (A=/tmp/base-bin)
O=/tmp/fjz/out; mkdir -p $O
cmp() { # label bindir
  $2/twinhub-bench compare --bin $2/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/$1.json > $O/$1.txt 2> $O/$1.err
  echo "$1 $(grep '^twinhub ' $O/$1.txt)"
}
rate() { # label bindir
  rm -rf /tmp/fjz/cl; $2/twinhub cluster up --dir /tmp/fjz/cl > /dev/null 2>&1
  $2/twinhub-bench run --cluster /tmp/fjz/cl/cluster.json --devices 0 --twins 10000 --rate 6800 --concurrency 64 --mix patch=100 --value-bytes 200 --duration 30 --out $O/$1.json > $O/$1.txt 2> $O/$1.err
  slow=""; fs=""
  for p in $(grep -o '"http": "127.0.0.1:[0-9]*' /tmp/fjz/cl/cluster.json | cut -d: -f3); do
    m=$(curl -sk https://127.0.0.1:$p/metrics)
    c=$(echo "$m" | grep '^twinhub_storage_fsync_seconds_count' | awk '{print $2}')
    s=$(echo "$m" | grep '^twinhub_storage_fsync_seconds_sum' | awk '{print $2}')
    f=$(echo "$m" | grep 'twinhub_storage_fsync_seconds_bucket{le="0.01"}' | awk '{print $2}')
    slow="$slow $((c-f))"; fs="$fs $(python3 -c "print('%.0f'%($s/$c*1e6))")"
  done
  $2/twinhub cluster down --dir /tmp/fjz/cl > /dev/null 2>&1
  echo "$1 $(grep '^patch' $O/$1.txt | awk '{print "ops/s",$4,"p50",$5,"p90",$6,"p99",$7,"p99.9",$8}') fsync>10ms per node:$slow; mean fsync us:$fs; per-second p99: $(python3 -c "
import json; d=json.load(open('$O/$1.json')); print(' '.join('%.0f'%s['p99_ms'] for s in d['results']['series']))")"
}
cmp base-a /tmp/base-bin; cmp zero-a /tmp/fjz; cmp zero-b /tmp/fjz; cmp base-b /tmp/base-bin
rate rbase-a /tmp/base-bin; rate rzero-a /tmp/fjz; rate rzero-b /tmp/fjz; rate rbase-b /tmp/base-bin
