#!/bin/bash
# ab-build.sh OLD_BINDIR NEW_BINDIR OUTDIR: the second series, ABBA, main against main with
# experiment-hold-freed-pages.patch applied (the node sets mimalloc's purge delay to 120 s itself).
A=$(dirname "$0")/../write-path-2026-12-04-threads/ab.sh; F=$(dirname "$0")/faults.sh
OLD=$1; NEW=$2; O=$3; mkdir -p "$O"
one() { bash $F "$O/$3.flt" & local p=$!; bash $A "$@"; kill $p; }
for r in 1 2 3 4; do
  if [ $((r%2)) = 1 ]; then one $OLD $O old-$r; one $NEW $O new-$r
  else one $NEW $O new-$r; one $OLD $O old-$r; fi
done
