#!/bin/bash
# One latency sweep (25 % and 50 % only) with the threads of the nodes, or of the nodes and the load
# generator, on a given CPU slice (see slice.py); run from the repository's root with a release build.
#   [US=200] ab.sh ROUND base|srv|all     results in $OUT (default target/slices)
here=$(cd "$(dirname "$0")" && pwd)
r=$1; arm=$2; us=${US:-200}; out=${OUT:-target/slices}
mkdir -p "$out"
case $arm in
  srv) python3 "$here/slice.py" "$us" "twinhub serve" & sp=$! ;;
  all) python3 "$here/slice.py" "$us" "twinhub serve" "twinhub-bench" & sp=$! ;;
  *) sp= ;;
esac
target/release/twinhub bench latency-sweep --duration 20 --percents 25,50 --out "$out/$arm-$us-$r.json" > "$out/$arm-$us-$r.txt" 2>&1
[ -n "$sp" ] && kill "$sp"
grep -E "^(max|25%|50%)" "$out/$arm-$us-$r.txt" | sed "s/^/$arm-$us-$r /"
