#!/bin/bash
O=/tmp/tl/cmp; mkdir -p $O
for i in 1 2; do
  for v in e901:/tmp/final-e901 imbl:/tmp/tl/imbl; do
    l=${v%%:*}; b=${v#*:}; sync
    $b/twinhub-bench compare --bin $b/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/$l-$i.json > $O/$l-$i.txt 2> $O/$l-$i.err
    echo "$l-$i $(grep '^twinhub ' $O/$l-$i.txt)"
  done
done
