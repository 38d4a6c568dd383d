#!/usr/bin/env python3
# machine.py OUT: every second, the machine's CPU split (user, system, softirq, idle, iowait, steal; % of both
# cores), major page faults and CPU pressure. To tell a stall of the host (steal) from one of the guest.
import sys, time
out = open(sys.argv[1], "w")
def cpu():
    f = open("/proc/stat").readline().split()[1:]
    return [int(x) for x in f]
def vm():
    for l in open("/proc/vmstat"):
        if l.startswith("pgmajfault "): return int(l.split()[1])
def psi():
    for l in open("/proc/pressure/cpu"):
        if l.startswith("some"): return int(l.split("total=")[1])
c0, v0, p0 = cpu(), vm(), psi()
while True:
    time.sleep(1)
    c1, v1, p1 = cpu(), vm(), psi()
    d = [b - a for a, b in zip(c0, c1)]; tot = max(1, sum(d[:8]))
    pct = lambda i: 100.0 * d[i] / tot
    out.write(f"{time.strftime('%T')} user={pct(0)+pct(1):.0f} sys={pct(2):.0f} softirq={pct(6):.0f} idle={pct(3):.0f} iowait={pct(4):.0f} steal={pct(7):.1f} majflt={v1-v0} cpu_some_ms={(p1-p0)/1000:.0f}\n"); out.flush()
    c0, v0, p0 = c1, v1, p1
