#!/bin/bash
# ab.sh: fjall journal written with zeros ahead of its data (B=/tmp/fjz2, vendor/fjall) vs as released (A=/tmp/base-bin), interleaved, twinhub only
O=/tmp/fjz2/out; mkdir -p $O
cmp() { # label bindir
  $2/twinhub-bench compare --bin $2/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/$1.json > $O/$1.txt 2> $O/$1.err
  echo "$1 $(grep '^twinhub ' $O/$1.txt)"
}
cmp ahead-a /tmp/fjz2; cmp base-a /tmp/base-bin; cmp base-b /tmp/base-bin; cmp ahead-b /tmp/fjz2
