#!/bin/bash
# issue-runs.sh BINDIR OUTDIR N: the command N times, alternating the order of the systems
# (odd runs twinhub first, even runs twinhub last), so that neither place in the order favours it.
B=${1:?BINDIR}; O=${2:?OUTDIR}; N=${3:-4}; mkdir -p "$O"
for i in $(seq 1 "$N"); do
  if [ $((i % 2)) = 1 ]; then s=twinhub,etcd,nats; else s=etcd,nats,twinhub; fi
  "$B/twinhub-bench" compare --bin "$B/twinhub" --systems $s --duration 30 --concurrency 64 --twins 10000 \
    --value-bytes 200 --out "$O/run-$i.json" > "$O/run-$i.txt" 2> "$O/run-$i.err"
  awk -v r=run-$i '$2 ~ /^[0-9]+$/ && !($1 in s){s[$1]=$2; c[$1]=$10; p[$1]=$5}
    END{printf "%s twinhub %d etcd %d nats %d  vs etcd %.2f vs nats %.2f cpu %.2f p99 %.2f\n", r, s["twinhub"], s["etcd"], s["nats"],
    s["twinhub"]/s["etcd"], s["twinhub"]/s["nats"], c["twinhub"]/c["etcd"], p["twinhub"]/p["etcd"]}' "$O/run-$i.txt"
done
