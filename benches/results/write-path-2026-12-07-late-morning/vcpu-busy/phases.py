#!/usr/bin/env python3
# phases.py OUTDIR: for each sweep of sweeps.sh (or ../pinned-workers/sweeps.sh), each vCPU's mean busy share
# over seconds 5-25 of the closed loop and of the half-load phase, placed back from the sweep's end time by
# the number of progress lines of each phase (to within a second or two).
import sys, re, datetime, glob
d = sys.argv[1]
T = lambda s: datetime.datetime.strptime(s, "%H:%M:%S")
cpu = {}
for l in open(f"{d}/percpu.txt"):
    p = l.split(); cpu[T(p[0])] = [int(re.search(r"busy(\d+)", x).group(1)) for x in p[1:]]
def mean(a):
    v = [cpu[a + datetime.timedelta(seconds=k)] for k in range(5, 26) if a + datetime.timedelta(seconds=k) in cpu]
    return " / ".join(f"{sum(c[j] for c in v) / len(v):.0f}" for j in range(len(v[0]))) if v else "-"
for l in open(f"{d}/marks.txt"):
    m = re.match(r"(.*?) ?(?:run |sweep )(\d+) end (\S+) .*?max [\d.]+ [\d.]+ [\d.]+ ([\d.]+) .*?50% (\d+) \d+ [\d.]+ [\d.]+ ([\d.]+)", l)
    if not m: continue
    label, i, end, maxp99, rate, p99 = m.groups()
    err = glob.glob(f"{d}/sweep-{i}{'-' + label.replace('=', '') if label else ''}.err")[0]
    lines = [x for x in open(err) if x.startswith("[")]
    n50 = sum(1 for x in lines if x.startswith("[50%]"))
    mx = [x for x in lines if x.startswith("[max]")]
    last_restart = max(k for k, x in enumerate(mx) if re.search(r"\]\s+1s", x))
    nmax = len(mx) - last_restart
    h0 = T(end) - datetime.timedelta(seconds=n50 + 1); m0 = h0 - datetime.timedelta(seconds=nmax + 1)
    print(f"sweep {i}{' ' + label if label else ''}: closed loop {mean(m0)} %;  50 % ({rate}/s, p99 {p99} ms) {mean(h0)} %")
