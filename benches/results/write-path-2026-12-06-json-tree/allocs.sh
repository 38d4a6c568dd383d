#!/bin/bash
# allocs.sh BIN MODE: heap allocations (calls to mimalloc's aligned malloc, zalloc and realloc, which
# every Rust allocation goes through) per write of examples/apply_count.rs, from callgrind call counts
# of 1,000 and 2,000 writes.
c() { valgrind --tool=callgrind --callgrind-out-file=/tmp/al-$$.out "$1" "$3" "$2" > /dev/null 2>&1; python3 "$(dirname "$0")/allocs.py" /tmp/al-$$.out; }
a=$(c "$1" "$2" 1000); b=$(c "$1" "$2" 2000); echo "$1 $2 allocations per write: $(( (b - a) / 1000 ))"
