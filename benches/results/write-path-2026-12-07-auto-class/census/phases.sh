#!/bin/bash
# System calls and context switches of the three nodes for 5 s in the closed-loop phase and 5 s in the 25 % phase of one sweep.
# Usage: phases.sh BINDIR OUTDIR   (prints the two perf stat blocks; the sweep's own output goes to OUTDIR/sweep.out)
B=${1:?BINDIR}; out=${2:?OUTDIR}; mkdir -p $out
($B/twinhub-bench latency-sweep --bin $B/twinhub --percents 25 --duration 30 --out $out/sweep.json > $out/sweep.out 2>&1 &)
EV='syscalls:sys_enter_fdatasync,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,context-switches'
for ph in "max\]    10s" "25%\]    10s"; do
  for i in $(seq 1 150); do grep -q "^\[$ph" $out/sweep.out 2>/dev/null && break; sleep 1; done
  echo "== $ph"; perf stat -e $EV -p $(pgrep -f "twinhub serve" | paste -sd,) -- sleep 5 2>&1 | grep -E "^ +[0-9]"
done
