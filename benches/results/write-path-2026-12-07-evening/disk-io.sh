#!/bin/bash
# disk-io.sh BINDIR OUTDIR SYSTEM: a compare of SYSTEM alone (the issue's shape), and the disk's own counters
# (/sys/block/DEV/stat of the device under the data directories) over 10 s of its window: writes, bytes, flushes and
# the time the device was busy, each per second and per acknowledged update. Run from the repository root.
BD=$1; W=$2; S=$3; DEV=${DEV:-vda}; mkdir -p $W
TWINHUB_BIN=$BD/twinhub $BD/twinhub bench compare --systems $S --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $W/$S.json > $W/$S.txt 2> $W/$S.log &
B=$!
until grep -q "closed loop" $W/$S.log 2>/dev/null; do kill -0 $B 2>/dev/null || { tail $W/$S.log; exit 1; }; sleep 1; done
sleep 8
a=$(cat /sys/block/$DEV/stat); t0=$(date +%s.%N); sleep 10; b=$(cat /sys/block/$DEV/stat); t1=$(date +%s.%N)
wait $B
rate=$(python3 -c "import json;print(json.load(open('$W/$S.json'))['$S']['updates_per_s'])")
python3 - "$a" "$b" "$t0" "$t1" "$rate" "$S" <<'PY' | tee $W/$S-disk.txt
import sys
a=list(map(int,sys.argv[1].split())); b=list(map(int,sys.argv[2].split())); dt=float(sys.argv[4])-float(sys.argv[3]); r=float(sys.argv[5])
d=[y-x for x,y in zip(a,b)]
w,sec,wms,busy,fl,flms=d[4],d[6],d[7],d[9],d[15],d[16]
print(f"{sys.argv[6]}: {r:,.0f} updates/s; disk over {dt:.1f} s: {w/dt:,.0f} writes/s ({w/dt/r:.3f} per update), "
      f"{sec*512/dt/1e6:.1f} MB/s ({sec*512/dt/r:,.0f} B per update), {fl/dt:,.0f} flushes/s ({fl/dt/r:.3f} per update, "
      f"{(flms/fl*1000 if fl else 0):.0f} us each), device busy {busy/dt/10:.1f} %, {wms/max(w,1)*1000:.0f} us per write")
PY
