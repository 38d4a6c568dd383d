#!/bin/bash
# abba.sh BINDIR OUTDIR PAIRS: a build with inline-writer-prototype.patch applied (BINDIR holds its twinhub
# and twinhub-bench); the group commit run inline on the calling thread (GC_INLINE=1, rows i) against
# its writer thread (rows t), same binary, ABBA order; twinhub-only compares (ab.sh of write-path-2026-12-04-threads).
B=${1:?BINDIR}; O=${2:?OUTDIR}; N=${3:-4}; ab=$(dirname "$0")/../../write-path-2026-12-04-threads/ab.sh
for i in $(seq 1 $N); do
  if [ $((i % 2)) = 1 ]; then $ab $B $O i$i GC_INLINE=1; $ab $B $O t$i; else $ab $B $O t$i; $ab $B $O i$i GC_INLINE=1; fi
done
