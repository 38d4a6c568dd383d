#!/bin/bash
# abj.sh: on a journaled ext4 (loop device over a zero-filled image, direct I/O; TWINHUB_BENCH_TMP=/mnt/j): zeros ahead (/tmp/fjz2) vs as released (/tmp/base-bin), twinhub only, interleaved
O=/tmp/fjz2/abj; mkdir -p $O
cmp() { TWINHUB_BENCH_TMP=/mnt/j $2/twinhub-bench compare --bin $2/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/$1.json > $O/$1.txt 2> $O/$1.err; echo "$1 $(grep '^twinhub ' $O/$1.txt)"; }
cmp base-a /tmp/base-bin; cmp ahead-a /tmp/fjz2; cmp ahead-b /tmp/fjz2; cmp base-b /tmp/base-bin
# then, a second series: cmp ahead-c /tmp/fjz2; cmp base-c /tmp/base-bin; cmp base-d /tmp/base-bin; cmp ahead-d /tmp/fjz2
