#!/bin/bash
# one 1M load, sampling /proc/stat (whole machine) and the nodes' CPU every 2 s
out=$1; bin=$2; mkdir -p $out
TWINHUB_BIN=$bin/twinhub timeout 900 $bin/twinhub-bench memory --twins 1000000 --tags --settle-secs 5 --out $out/m.json > $out/m.txt 2> $out/m.log &
B=$!
sleep 3
PIDS=$(pgrep -f "twinhub serve" | paste -sd' ')
while kill -0 $B 2>/dev/null; do
  t=0; for p in $PIDS; do s=$(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null); t=$((t+${s:-0})); done
  k=$(ps -eo comm,time --no-headers | awk '$1 ~ /kworker|jbd2|kswapd|kcompactd/ {split($2,a,":"); s+=a[1]*3600+a[2]*60+a[3]} END {print s+0}')
  echo "$(date +%s.%N | cut -c1-14) $(head -1 /proc/stat | cut -d' ' -f3-) nodes $t kthreads $k last $(tail -1 $out/m.log | awk '{print $1}')"
  sleep 2
done > $out/stat.tsv
