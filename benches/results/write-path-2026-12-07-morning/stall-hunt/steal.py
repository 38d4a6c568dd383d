#!/usr/bin/env python3
# steal.py OUTDIR: for each sweep of run.sh, the hypervisor's steal (% of the machine's CPU, machine.txt)
# over the 30 s half-load window (the 31 s before the sweep ended, less the last second) and over the
# closed-loop window before it (its 35 s before that: warm-up and measured), mean and worst second,
# beside the sweep's half-load p99.
import sys, re, datetime
d = sys.argv[1]
def t(s): return datetime.datetime.strptime(s, "%H:%M:%S")
steal = {}
for l in open(f"{d}/machine.txt"):
    m = re.match(r"(\S+) .*steal=([\d.]+)", l)
    if m: steal[t(m.group(1))] = float(m.group(2))
def window(a, b):
    v = [s for k, s in steal.items() if a <= k < b]
    return (sum(v) / len(v), max(v)) if v else (float("nan"), float("nan"))
print(f"{'sweep':>5} {'end':>8} {'50% p99 ms':>10} {'steal at 50%: mean':>18} {'worst s':>7} {'steal at max: mean':>18} {'worst s':>7}")
for l in open(f"{d}/marks.txt"):
    m = re.match(r"(\d+) (\S+) 50% (\S+) (\S+) (\S+) (\S+) (\S+)", l)
    if not m: continue
    end = t(m.group(2)); p99 = float(m.group(7))
    h = window(end - datetime.timedelta(seconds=31), end - datetime.timedelta(seconds=1))
    x = window(end - datetime.timedelta(seconds=68), end - datetime.timedelta(seconds=33))
    print(f"{m.group(1):>5} {m.group(2):>8} {p99:>10.2f} {h[0]:>18.1f} {h[1]:>7.1f} {x[0]:>18.1f} {x[1]:>7.1f}")
