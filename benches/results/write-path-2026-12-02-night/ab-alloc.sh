#!/bin/bash
# ab-alloc.sh OUT ROUNDS VARIANTS...: twinhub-only compares of each variant's binary (/work/alloc/V/twinhub), interleaved
OUT=$1; R=$2; shift 2
for i in $(seq 1 $R); do for v in "$@"; do
  line=$(/work/main/target/release/twinhub bench compare --systems twinhub --bin /work/alloc/$v/twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out /tmp/ab-$v-$i.json 2>/dev/null | grep "^twinhub ")
  echo "$v run $i: $line" | tee -a $OUT
done; done
