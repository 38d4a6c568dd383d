#!/bin/bash
# count.sh BIN MODE N: instructions executed by examples/apply_count.rs (BIN) for N writes as MODE
# (leader|follower), under cachegrind (no cache simulation: exact instruction counts).
valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$1" "$3" "$2" 2>&1 | grep -o "I *refs: *[0-9,]*" | tr -d ', ' | cut -d: -f2
