#!/bin/bash
# abn.sh FROM TO: N interleaved pairs paced / unpaced
for i in $(seq $1 $2); do
  sync; /tmp/tl/ab.sh on-$i /tmp/tl/paced > /dev/null
  sync; EXPERIMENT_PACE_OFF=1 /tmp/tl/ab.sh off-$i /tmp/tl/paced > /dev/null
  for l in on-$i off-$i; do echo "$l $(grep patch /tmp/tl/out/$l.txt)"; done
done
