#!/usr/bin/env python3
# Every second: vda's writes and flushes completed, their mean wait, I/O in flight, the disk's pressure
# ("some", ms of the second), Dirty and Writeback memory. Usage: disk.py OUT
import sys, time
out = open(sys.argv[1], 'w')
def disk():
    for l in open('/proc/diskstats'):
        f = l.split()
        if f[2] == 'vda':
            # writes completed, ms writing, in flight, flushes completed, ms flushing
            return int(f[7]), int(f[10]), int(f[11]), int(f[18]) if len(f) > 18 else 0, int(f[19]) if len(f) > 19 else 0
def psi():
    for l in open('/proc/pressure/io'):
        if l.startswith('some'):
            return int(l.split('total=')[1])
def mem():
    m = {}
    for l in open('/proc/meminfo'):
        k, v = l.split(':'); m[k] = int(v.split()[0])
    return m['Dirty'] // 1024, m['Writeback'] // 1024
d0, p0 = disk(), psi()
while True:
    time.sleep(1)
    d1, p1 = disk(), psi()
    w = d1[0] - d0[0]; fl = d1[3] - d0[3]
    out.write(f"{time.strftime('%T')} writes={w} write_wait_ms={(d1[1]-d0[1])/max(1,w):.2f} flushes={fl} flush_wait_ms={(d1[4]-d0[4])/max(1,fl):.2f} inflight={d1[2]} io_some_ms={(p1-p0)/1000:.0f} dirty_wb_MB={mem()}\n"); out.flush()
    d0, p0 = d1, p1
