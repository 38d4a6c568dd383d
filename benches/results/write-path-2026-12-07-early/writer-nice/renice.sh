#!/bin/bash
# renice.sh NICE: while running, give every twinhub node's group-commit writer thread nice NICE.
N=${1:--10}
declare -A done
while true; do
  for pid in $(pgrep -f "twinhub serve"); do
    for t in /proc/$pid/task/*; do
      tid=${t##*/}
      [ -n "${done[$tid]}" ] && continue
      c=$(cat $t/comm 2>/dev/null)
      case "$c" in raft-group-comm*) renice -n $N -p $tid >/dev/null 2>&1 && done[$tid]=1;; esac
    done
  done
  sleep 0.3
done
