#!/bin/bash
# Interleaved A/B rounds of two server builds, the same client: closed loop and a fixed rate, each run
# on a fresh 3-node cluster, server CPU per update from /proc (see ../write-path-2026-11-28-evening/group-commit-run.sh).
#   [ROUNDS=4] [RATE=1650] CLIENT=path/to/twinhub-bench ab-rounds.sh BIN_A BIN_B
A=$1; B=$2; RUN="$(dirname "$0")/../write-path-2026-11-28-evening/group-commit-run.sh"
for i in $(seq 1 ${ROUNDS:-4}); do
  echo "# round $i/${ROUNDS:-4}" >&2
  for side in A B; do
    bin=$A; [ $side = B ] && bin=$B
    SC=8 "$RUN" $bin ab-$side-closed | grep -v '^client'
    SC=8 RATE=${RATE:-1650} "$RUN" $bin ab-$side-rate | grep -v '^client'
  done
done
