#!/bin/bash
# sum-faults.sh FILE.flt...: total minor faults and CPU ticks of the three nodes of each run
for f in "$@"; do
  awk -v L="$(basename "$f" .flt)" '{flt[$1]=$2; cpu[$1]=$3+$4} END{s=0;c=0;for(p in flt){s+=flt[p];c+=cpu[p]}; printf "%-12s minor faults %7d  CPU ticks %5d\n", L, s, c}' "$f"
done
