#!/bin/bash
# faults.sh OUT: once a second, each `twinhub serve` process's minor page faults and utime+stime ticks
# (fields 10, 14, 15 of /proc/PID/stat) as "pid minflt utime stime"; the last line per pid is its total.
while true; do
  for p in $(pgrep -f 'twinhub serve' 2>/dev/null); do
    read -r -a f < /proc/$p/stat 2>/dev/null || continue
    echo "$p ${f[9]} ${f[13]} ${f[14]}"
  done
  sleep 1
done > "$1"
