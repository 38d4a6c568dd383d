#!/usr/bin/env python3
# rounds.py OUTDIR [P99_MS]: every measured second of run.sh's half-load phases, with how many group-commit
# rounds on any node had a write (or fsync) over 10 ms in that second or the one before; then how often such
# a round falls in the slow seconds (p99 over P99_MS, default 25) against in the others.
import sys, re, datetime, collections
d = sys.argv[1]; lim = float(sys.argv[2]) if len(sys.argv) > 2 else 25.0
T = lambda s: datetime.datetime.strptime(s, "%H:%M:%S")
slow_w = collections.Counter(); slow_f = collections.Counter()
for l in open(f"{d}/metrics.txt"):
    m = re.match(r"(\S+) n\d+ .*write_slow=(-?\d+)/(-?\d+)/(-?\d+) fsync_slow=(-?\d+)/(-?\d+)/(-?\d+)", l)
    if m:
        t = T(m.group(1))
        slow_w[t] += max(0, int(m.group(3))); slow_f[t] += max(0, int(m.group(6)))
ends = {}
for l in open(f"{d}/marks.txt"):
    m = re.match(r"(\d+) (\S+) 50%", l)
    if m: ends[int(m.group(1))] = T(m.group(2))
groups = {"slow": [0, 0, 0], "other": [0, 0, 0]}  # seconds, with a write > 10 ms, with an fsync > 10 ms
print(f"{'sweep':>5} {'second':>6} {'time':>8} {'p99 ms':>8} {'writes>10ms':>11} {'fsyncs>10ms':>11}")
for i, end in sorted(ends.items()):
    secs = [l for l in open(f"{d}/sweep-{i}.err") if l.startswith("[50%]")][2:]
    start = end - datetime.timedelta(seconds=len(secs) + 1)
    for k, l in enumerate(secs):
        p99 = float(re.search(r"p99\s+([\d.]+) ms", l).group(1))
        t = start + datetime.timedelta(seconds=k + 1)
        w = slow_w[t] + slow_w[t + datetime.timedelta(seconds=1)]
        f = slow_f[t] + slow_f[t + datetime.timedelta(seconds=1)]
        g = groups["slow" if p99 > lim else "other"]
        g[0] += 1; g[1] += w > 0; g[2] += f > 0
        if p99 > lim:
            print(f"{i:>5} {k+1:>6} {t.strftime('%H:%M:%S'):>8} {p99:>8.2f} {w:>11} {f:>11}")
for name, (n, w, f) in groups.items():
    print(f"{name} seconds: {n}; with a write over 10 ms: {w} ({100*w/max(n,1):.0f} %), with an fsync over 10 ms: {f} ({100*f/max(n,1):.0f} %)")
