#!/bin/bash
# abc.sh: closed-loop twinhub-only compares, interleaved: whole journal zero-filled at creation (/tmp/fjz), zeros ahead (/tmp/fjz2), as released (/tmp/base-bin)
O=/tmp/fjz2/abc; mkdir -p $O
cmp() { $2/twinhub-bench compare --bin $2/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O/$1.json > $O/$1.txt 2> $O/$1.err; echo "$1 $(grep '^twinhub ' $O/$1.txt)"; }
cmp full-a /tmp/fjz; cmp base-a /tmp/base-bin; cmp ahead-a /tmp/fjz2
cmp ahead-b /tmp/fjz2; cmp full-b /tmp/fjz; cmp base-b /tmp/base-bin
cmp base-c /tmp/base-bin; cmp ahead-c /tmp/fjz2; cmp full-c /tmp/fjz
