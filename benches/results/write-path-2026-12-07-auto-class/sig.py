#!/usr/bin/env python3
# Every second: machine busy %, CPU pressure (some, % of the second), and the nodes' threads' run-queue wait per ms of CPU.
import os, time, sys, subprocess
out = open(sys.argv[1], 'w')
def stat():
    f = open('/proc/stat').readline().split()[1:9]; v = list(map(int, f)); return sum(v), v[3]+v[4]
def psi():
    for l in open('/proc/pressure/cpu'):
        if l.startswith('some'):
            return int(l.split('total=')[1])
def nodes():
    run = wait = 0
    for p in subprocess.run(['pgrep', '-f', 'twinhub serve'], capture_output=True, text=True).stdout.split():
        try:
            for t in os.listdir(f'/proc/{p}/task'):
                try:
                    r, w, _ = open(f'/proc/{p}/task/{t}/schedstat').read().split(); run += int(r); wait += int(w)
                except Exception: pass
        except Exception: pass
    return run, wait
t0, i0 = stat(); p0 = psi(); r0, w0 = nodes()
while True:
    time.sleep(1)
    t1, i1 = stat(); p1 = psi(); r1, w1 = nodes()
    busy = 100 * (1 - (i1 - i0) / max(1, t1 - t0)); pr = (p1 - p0) / 1e4
    dr, dw = r1 - r0, w1 - w0
    out.write(f"{time.strftime('%T')} busy={busy:.0f}% psi_some={pr:.0f}% node_wait_per_run={dw/max(1,dr):.2f} node_cpu={dr/1e9:.2f}\n"); out.flush()
    t0, i0, p0, r0, w0 = t1, i1, p1, r1, w1
