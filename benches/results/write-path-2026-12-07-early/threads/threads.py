#!/usr/bin/env python3
# threads.py OUT: every second, CPU (ms) used in that second by each thread name of the twinhub nodes (summed over nodes), and the load generator.
import os, sys, time, collections
out = open(sys.argv[1], "w")
tck = os.sysconf("SC_CLK_TCK")
prev = {}
while True:
    now = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = open(f"/proc/{pid}/cmdline","rb").read().split(b"\0")
        except OSError: continue
        if len(cmd) < 2: continue
        exe = os.path.basename(cmd[0]).decode(errors="replace")
        if exe == "twinhub" and cmd[1] == b"serve": who = "node"
        elif exe == "twinhub-bench": who = "bench"
        else: continue
        try: tasks = os.listdir(f"/proc/{pid}/task")
        except OSError: continue
        for t in tasks:
            try:
                s = open(f"/proc/{pid}/task/{t}/stat").read()
            except OSError: continue
            name = s[s.index("(")+1:s.rindex(")")]
            f = s[s.rindex(")")+2:].split()
            now[(pid, t)] = (who + ":" + name, int(f[11]) + int(f[12]))
    agg = collections.Counter()
    for k, (name, ticks) in now.items():
        if k in prev: agg[name] += (ticks - prev[k][1]) * 1000 // tck
    prev = now
    top = " ".join(f"{n}={v}" for n, v in agg.most_common(8) if v > 0)
    out.write(time.strftime("%H:%M:%S") + " " + top + "\n"); out.flush()
    time.sleep(1)
