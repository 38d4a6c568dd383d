#!/bin/bash
# usage: watch.sh PATTERN  -- puts threads of running `twinhub serve` nodes whose comm matches PATTERN (egrep) into SCHED_BATCH, until killed
pat="$1"
while true; do
  for p in $(pgrep -f "twinhub serve"); do
    for t in /proc/$p/task/*; do
      tid=${t##*/}
      c=$(cat $t/comm 2>/dev/null) || continue
      if [[ "$c" =~ $pat ]]; then
        pol=$(awk '{print $41}' $t/stat 2>/dev/null)
        [ "$pol" = "3" ] || chrt -b -p 0 $tid 2>/dev/null
      fi
    done
  done
  sleep 0.3
done
