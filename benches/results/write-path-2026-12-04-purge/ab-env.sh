#!/bin/bash
# ab-env.sh BINDIR OUTDIR: the first series, ABBA, the same build with and without MIMALLOC_PURGE_DELAY=-1
# (mimalloc never returns freed pages); pairs 5-8 also record page faults (faults.sh).
A=$(dirname "$0")/../write-path-2026-12-04-threads/ab.sh; F=$(dirname "$0")/faults.sh
B=$1; O=$2; mkdir -p "$O"
one() { local l=$1; shift; bash $F "$O/$l.flt" & local p=$!; bash $A "$B" "$O" "$l" "$@"; kill $p; }
for r in 1 2 3 4 5 6 7 8; do
  if [ $((r%2)) = 1 ]; then one base-$r; one nopurge-$r MIMALLOC_PURGE_DELAY=-1
  else one nopurge-$r MIMALLOC_PURGE_DELAY=-1; one base-$r; fi
done
for d in 5000 30000 120000; do one pd$d MIMALLOC_PURGE_DELAY=$d; done
one reset MIMALLOC_PURGE_DECOMMITS=0; one thp2 MIMALLOC_ALLOW_THP=2; one base-9
