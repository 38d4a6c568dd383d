#!/bin/bash
# Every second: the number of the nodes' threads in SCHED_BATCH and in the default class, with the machine's busy share.
out=${1:?OUT}
prev=($(head -1 /proc/stat))
while true; do
  sleep 1
  cur=($(head -1 /proc/stat))
  tot=0; ptot=0; for k in 1 2 3 4 5 6 7 8; do tot=$((tot+cur[k])); ptot=$((ptot+prev[k])); done
  idle=$(( (cur[4]+cur[5]) - (prev[4]+prev[5]) )); dt=$((tot-ptot))
  busy=$(( dt>0 ? 100*(dt-idle)/dt : 0 ))
  prev=("${cur[@]}")
  b=0; t=0
  for p in $(pgrep -f "twinhub serve"); do
    for c in $(ps -L -o cls= -p $p 2>/dev/null); do [ "$c" = B ] && b=$((b+1)) || t=$((t+1)); done
  done
  echo "$(date +%T) busy=$busy% B=$b TS=$t"
done > $out
