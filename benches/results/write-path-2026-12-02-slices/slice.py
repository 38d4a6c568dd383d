#!/usr/bin/env python3
"""Gives every thread of the matching processes an EEVDF slice of SLICE_US (sched_attr.sched_runtime for
SCHED_OTHER), keeping each thread's nice. Threads at nice > 0 (background) are left alone.
   slice.py SLICE_US PATTERN... ; loops every second until killed."""
import ctypes, os, sys, time, struct, subprocess
libc = ctypes.CDLL(None, use_errno=True)
SYS_sched_setattr = 314
us = int(sys.argv[1]); pats = sys.argv[2:]
done = set()
def pids():
    out = subprocess.run(['pgrep', '-f', '|'.join(pats)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]
while True:
    for pid in pids():
        try: tids = os.listdir(f'/proc/{pid}/task')
        except FileNotFoundError: continue
        for t in tids:
            tid = int(t)
            if tid in done: continue
            try: nice = os.getpriority(os.PRIO_PROCESS, tid)
            except OSError: continue
            if nice > 0: done.add(tid); continue
            attr = struct.pack('IIQiIQQQ', 48, 0, 0, nice, 0, us * 1000, 0, 0)
            buf = ctypes.create_string_buffer(attr, 48)
            r = libc.syscall(SYS_sched_setattr, tid, buf, 0)
            if r != 0: print('err', tid, ctypes.get_errno(), file=sys.stderr)
            done.add(tid)
    time.sleep(1)
