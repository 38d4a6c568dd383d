#!/bin/bash
# journaled.sh: on the journaled ext4 of journaled-ext4.sh (TWINHUB_BENCH_TMP=/mnt/j): the final build beside etcd and NATS, the build before it, and a latency sweep of each
O=/tmp/final5/j; mkdir -p $O; export TWINHUB_BENCH_TMP=/mnt/j
/tmp/final5/twinhub-bench compare --bin /tmp/final5/twinhub --systems twinhub,etcd,nats --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/compare-final.json > $O/compare-final.txt 2> $O/compare-final.err
/tmp/base-bin/twinhub-bench compare --bin /tmp/base-bin/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/compare-before.json > $O/compare-before.txt 2> $O/compare-before.err
/tmp/final5/twinhub-bench latency-sweep --bin /tmp/final5/twinhub --duration 20 --out $O/sweep-final.json > $O/sweep-final.txt 2> $O/sweep-final.err
/tmp/base-bin/twinhub-bench latency-sweep --bin /tmp/base-bin/twinhub --duration 20 --out $O/sweep-before.json > $O/sweep-before.txt 2> $O/sweep-before.err
