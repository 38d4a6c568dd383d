#!/usr/bin/env python3
# slow.py OUTDIR [P99_MS]: for each measured half-load second of run.sh's sweeps whose p99 was over P99_MS
# (default 40), the machine's samples in that second (perf script of the sweep's recording, wall-clock
# times) by thread name and by symbol, beside the same for all the sweep's half-load seconds: what ran more
# in the slow second than usual.
import sys, re, subprocess, datetime, collections
d = sys.argv[1]; lim = float(sys.argv[2]) if len(sys.argv) > 2 else 40.0
T = lambda s: datetime.datetime.strptime(s, "%H:%M:%S")
for l in open(f"{d}/marks.txt"):
    m = re.match(r"(\d+) (\S+) 50%", l)
    if not m: continue
    i, end = int(m.group(1)), m.group(2)
    secs = [x for x in open(f"{d}/sweep-{i}.err") if x.startswith("[50%]")][2:]
    slow = [(k + 1, float(re.search(r"p99\s+([\d.]+) ms", x).group(1))) for k, x in enumerate(secs)]
    slow = [(k, p) for k, p in slow if p > lim]
    if not slow: continue
    day = datetime.date.today()
    endt = datetime.datetime.combine(day, T(end).time()).replace(tzinfo=datetime.timezone.utc)
    start = endt - datetime.timedelta(seconds=len(secs) + 1)
    out = subprocess.run(["perf", "script", "-i", f"{d}/perf-{i}.data", "-F", "comm,time,ip,sym", "--ns"],
                         capture_output=True, text=True).stdout
    samples = []
    for line in out.splitlines():
        mm = re.match(r"\s*(.+?)\s+(\d+)\.(\d+):\s+[0-9a-f]+\s*(.*)$", line)
        if not mm: continue
        t = datetime.datetime.fromtimestamp(int(mm.group(2)), datetime.timezone.utc)
        samples.append((t, mm.group(1).strip(), (mm.group(4) or "?").strip()))
    def census(a, b):
        c = collections.Counter(); s = collections.Counter(); n = 0
        for t, comm, sym in samples:
            if a <= t < b:
                n += 1; c[re.sub(r"[-:0-9]+$", "", comm)] += 1; s[sym[:60]] += 1
        return n, c, s
    n0, c0, s0 = census(start, endt)
    secs_n = max(1, len(secs))
    for k, p99 in slow:
        a = start + datetime.timedelta(seconds=k - 1); b = a + datetime.timedelta(seconds=1)
        n, c, s = census(a, b)
        print(f"sweep {i} second {k} ({a.strftime('%H:%M:%S')}) p99 {p99:.2f} ms: {n} samples against {n0/secs_n:.0f} a second in the phase")
        for name, v in c.most_common(8):
            print(f"   thread {name:<24} {v:>5}  usual {c0[name]/secs_n:>7.1f}")
        rise = sorted(s, key=lambda x: s[x] - s0[x] / secs_n, reverse=True)[:10]
        for sym in rise:
            print(f"   symbol {sym:<60} {s[sym]:>5}  usual {s0[sym]/secs_n:>7.1f}")
