#!/usr/bin/env python3
# cpu.py OUTDIR: per sweep of run.sh (or linger/ab.sh), the closed-loop maximum and the half-load rate, the
# nodes' CPU (ms a second, threads.txt) and CPU per update in each phase, the machine's idle and steal
# (machine.txt) in each, and the half-load p99; the phase windows are taken back from the sweep's end.
import sys, re, json, datetime
d = sys.argv[1]
T = lambda s: datetime.datetime.strptime(s, "%H:%M:%S")
S = datetime.timedelta(seconds=1)
th = {}
for l in open(f"{d}/threads.txt"):
    p = l.split()
    if len(p) < 2: continue
    th[T(p[0])] = sum(int(x.split('=')[1]) for x in p[1:] if x.startswith('node:'))
mach = {}
for l in open(f"{d}/machine.txt"):
    m = re.match(r"(\S+) .*idle=(\d+) .*steal=([\d.]+)", l)
    if m: mach[T(m.group(1))] = (int(m.group(2)), float(m.group(3)))
def mean(v): return sum(v) / len(v) if v else float("nan")
print(f"{'sweep':>5} {'label':>10} {'max/s':>7} {'half/s':>7} {'node ms/s max':>13} {'half':>5} {'ms/update max':>13} {'half':>6} {'idle % max':>10} {'half':>5} {'steal % max':>11} {'half':>5} {'p99 @50 ms':>10}")
for l in open(f"{d}/marks.txt"):
    m = re.match(r"(\d+) (\S+) 50% (\S+) (\S+) (\S+) (\S+) (\S+)(.*)", l)
    if not m: continue
    i, end, half, p99 = int(m.group(1)), T(m.group(2)), float(m.group(4)), float(m.group(7))
    lab = re.search(r"linger (\d+)", m.group(8)); lab = f"linger {lab.group(1)}" if lab else ""
    mx = json.load(open(f"{d}/sweep-{i}.json"))["max_updates_per_s"]
    h = (end - 31 * S, end - 1 * S); x = (end - 66 * S, end - 36 * S)
    def w(a, f):
        return (mean([f(v) for k, v in a.items() if h[0] <= k < h[1]]), mean([f(v) for k, v in a.items() if x[0] <= k < x[1]]))
    nh, nm = w(th, lambda v: v)
    ih, im = w(mach, lambda v: v[0]); sh, sm = w(mach, lambda v: v[1])
    print(f"{i:>5} {lab:>10} {mx:>7.0f} {half:>7.0f} {nm:>13.0f} {nh:>5.0f} {nm/mx:>13.3f} {nh/half:>6.3f} {im:>10.1f} {ih:>5.1f} {sm:>11.1f} {sh:>5.1f} {p99:>10.2f}")
