#!/bin/bash
# ab.sh: forward_calls_per_peer both ways, interleaved, twinhub only
# B: a release build (twinhub, twinhub-bench) of the tree with forward-batching.patch applied
B=/tmp/fwb; O=/tmp/fwb/out; mkdir -p $O
run() { # label value
  TWINHUB_BENCH_NODE_OPTIONS=forward_calls_per_peer=$2 $B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/$1.json > $O/$1.txt 2> $O/$1.err
  echo "$1 $(grep '^twinhub ' $O/$1.txt)"
}
run fc0-a 0; run fc4-a 4; run fc0-b 0; run fc4-b 4; run fc2-a 2; run fc8-a 8; run fc1-a 1
