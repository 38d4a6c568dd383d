#!/bin/bash
# usage: abmix.sh OUTDIR label:clientdir:serverdir ...
out=$1; shift; mkdir -p $out
for spec in "$@"; do
  IFS=: read label cdir sdir <<< "$spec"
  echo "== $(date +%T) $label" >> $out/progress
  TWINHUB_BIN=$sdir/twinhub timeout 900 $cdir/twinhub bench memory --twins 1000000 --tags --out $out/$label.json > $out/$label.txt 2> $out/$label.log
  grep -E "populate|RSS 30|restart of" $out/$label.txt >> $out/progress
done
echo "done $(date +%T)" >> $out/progress
