#!/bin/bash
# run1m.sh BINDIR LABEL: compare at a million twins, twinhub only
BD=$1; L=$2; O=/tmp/m1
TWINHUB_BIN=$BD/twinhub $BD/twinhub-bench compare --systems twinhub --duration 30 --concurrency 64 --twins 1000000 --value-bytes 200 --out $O/c1m-$L.json > $O/c1m-$L.txt 2> $O/c1m-$L.err
grep -E "^twinhub " $O/c1m-$L.txt
