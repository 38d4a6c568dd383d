#!/usr/bin/env python3
"""CPU of every thread of every running `twinhub serve`, by process and thread name, every PERIOD s.

    thread-cpu.py [PERIOD] > threads.txt

One line per period: wall-clock time, the total in ms of CPU per second, then the busiest
`pid:thread-name:ms-per-second`. Lines up with timeline-run.sh's timestamped per-second lines, so a
slow second can be matched with what ran in it (for example fjall's flush workers on every node).
"""
import collections
import os
import sys
import time

PERIOD = float(sys.argv[1]) if len(sys.argv) > 1 else 0.25
TICKS = os.sysconf('SC_CLK_TCK')


def nodes():
    for p in os.listdir('/proc'):
        if not p.isdigit():
            continue
        try:
            argv = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\0')
        except OSError:
            continue
        if len(argv) > 1 and argv[0].endswith(b'twinhub') and argv[1] == b'serve':
            yield p


def sample():
    ticks = collections.Counter()
    for p in nodes():
        try:
            tasks = os.listdir(f'/proc/{p}/task')
        except OSError:
            continue
        for t in tasks:
            try:
                s = open(f'/proc/{p}/task/{t}/stat').read()
            except OSError:
                continue
            name = s[s.index('(') + 1:s.rindex(')')]
            fields = s[s.rindex(')') + 2:].split()
            ticks[f'{p}:{name}'] += int(fields[11]) + int(fields[12])
    return ticks


prev = sample()
while True:
    time.sleep(PERIOD)
    cur = sample()
    ms = {k: (cur[k] - prev.get(k, 0)) * 1000 / TICKS / PERIOD for k in cur}
    prev = cur
    top = sorted(ms.items(), key=lambda kv: -kv[1])[:8]
    busy = '  '.join(f'{k}:{v:.0f}' for k, v in top if v > 0)
    print(f'{time.time():.2f} total {sum(ms.values()):5.0f}  {busy}', flush=True)
