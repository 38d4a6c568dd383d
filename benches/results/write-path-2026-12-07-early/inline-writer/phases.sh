#!/bin/bash
# phases.sh BINDIR OUTDIR [VAR=VALUE...]: one latency sweep (closed loop, 25 %, 50 %; 20 s each) with the
# given environment; for 5 s from the 8th second of each phase, the three nodes' CPU time, context switches,
# futex calls and fdatasyncs (perf stat), printed per update of that phase.
B=${1:?BINDIR}; out=${2:?OUTDIR}; shift 2; mkdir -p $out
(env "$@" $B/twinhub-bench latency-sweep --bin $B/twinhub --percents 25,50 --duration 20 --out $out/sweep.json > $out/sweep.out 2>&1 &)
EV='task-clock,context-switches,syscalls:sys_enter_futex,syscalls:sys_enter_fdatasync'
for ph in "max" "25%" "50%"; do
  for i in $(seq 1 200); do grep -q "^\[$ph\]     8s" $out/sweep.out 2>/dev/null && break; sleep 0.5; done
  perf stat -x, -e $EV -p $(pgrep -f "twinhub serve" | paste -sd,) -- sleep 5 > $out/perf-$ph.csv 2>&1
done
for i in $(seq 1 200); do [ -f $out/sweep.json ] && break; sleep 1; done; sleep 1
python3 - "$out" <<'PY'
import sys, json, csv
out = sys.argv[1]
text = open(f"{out}/sweep.out").read()
rates = {}
for line in text.splitlines():
    # "[25%]    12s     4002 ops/s ..." : mean of the per-second rates from the 8th to the 12th second
    if line.startswith("["):
        ph = line[1:line.index("]")]
        parts = line[line.index("]")+1:].split()
        if len(parts) > 2 and parts[0].endswith("s") and parts[0][:-1].isdigit():
            sec = int(parts[0][:-1])
            if 9 <= sec <= 13:
                rates.setdefault(ph, []).append(float(parts[1]))
for ph in ["max", "25%", "50%"]:
    vals = {}
    for row in csv.reader(open(f"{out}/perf-{ph}.csv")):
        if len(row) > 3 and row[0].replace('.', '').isdigit():
            vals[row[2]] = float(row[0])
    r = sum(rates.get(ph, [0])) / max(1, len(rates.get(ph, [1])))
    n = r * 5
    print(f"{ph:4s} {r:8.0f}/s  CPU {vals.get('task-clock',0)/n*1000:6.1f} us/update  switches {vals.get('context-switches',0)/n:5.2f}"
          f"  futex {vals.get('syscalls:sys_enter_futex',0)/n:5.2f}  fdatasync {vals.get('syscalls:sys_enter_fdatasync',0)/n:5.3f}  cores {vals.get('task-clock',0)/5000:4.2f}")
PY
grep -E "^(max|25%|50%) " $out/sweep.out
