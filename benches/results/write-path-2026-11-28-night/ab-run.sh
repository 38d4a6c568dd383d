#!/bin/bash
# Fixed-rate and closed-loop PATCH runs with the client CPU counted, as run by the A/B rounds of the
# framed-transport experiment: the evening's group-commit run, which prints both.
#   [SC=8] [RATE=R] [CLIENT=twinhub-bench] ab-run.sh BIN LABEL
exec "$(dirname "$0")/../write-path-2026-11-28-evening/group-commit-run.sh" "$@"
