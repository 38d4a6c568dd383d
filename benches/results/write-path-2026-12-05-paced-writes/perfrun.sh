#!/bin/bash
B=/tmp/tl/paced; D=/tmp/tl/cl; O=/tmp/tl/out
rm -rf $D; $B/twinhub cluster up --dir $D > /dev/null 2>&1
$B/twinhub-bench run --cluster $D/cluster.json --devices 0 --twins 10000 --concurrency 64 --mix patch=100 --value-bytes 200 --duration 10 --out $O/perf-warm.json > /dev/null 2>&1
PID=$(grep -o '"pid": [0-9]*' $D/cluster.json | head -1 | awk '{print $2}')
$B/twinhub-bench run --cluster $D/cluster.json --devices 0 --twins 10000 --rate 7000 --concurrency 64 --mix patch=100 --value-bytes 200 --duration 25 --out $O/perf.json > /dev/null 2>&1 &
sleep 4
perf record -F 1999 -g -p $PID -o /tmp/tl/perf.data -- sleep 20 > /dev/null 2>&1
wait
$B/twinhub cluster down --dir $D > /dev/null 2>&1
