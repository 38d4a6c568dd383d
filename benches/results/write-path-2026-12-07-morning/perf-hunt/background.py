#!/usr/bin/env python3
# background.py OUTDIR: every measured half-load second of run.sh's sweeps, the samples of the storage's
# background threads in it (fjall's workers, the snapshot writer), and the seconds' p99 split by how busy
# those threads were: does a slow second follow background work?
import sys, re, subprocess, datetime, collections
d = sys.argv[1]
T = lambda s: datetime.datetime.strptime(s, "%H:%M:%S")
rows = []
for l in open(f"{d}/marks.txt"):
    m = re.match(r"(\d+) (\S+) 50%", l)
    if not m: continue
    i, end = int(m.group(1)), m.group(2)
    secs = [x for x in open(f"{d}/sweep-{i}.err") if x.startswith("[50%]")][2:]
    endt = datetime.datetime.combine(datetime.date.today(), T(end).time()).replace(tzinfo=datetime.timezone.utc)
    start = endt - datetime.timedelta(seconds=len(secs) + 1)
    out = subprocess.run(["perf", "script", "-i", f"{d}/perf-{i}.data", "-F", "comm,time", "--ns"], capture_output=True, text=True).stdout
    bg = collections.Counter()
    for line in out.splitlines():
        mm = re.match(r"\s*(.+?)\s+(\d+)\.(\d+):", line)
        if not mm: continue
        if mm.group(1).startswith("fjall:worker") or mm.group(1).startswith("raft-snapshots"):
            k = int((datetime.datetime.fromtimestamp(int(mm.group(2)), datetime.timezone.utc) - start).total_seconds())
            bg[k] += 1
    for k, x in enumerate(secs):
        rows.append((bg[k], float(re.search(r"p99\s+([\d.]+) ms", x).group(1))))
rows.sort()
n = len(rows)
for lo, hi in ((0, 10), (10, 20), (20, 35), (35, 1000)):
    sel = [p for b, p in rows if lo <= b < hi]
    if sel:
        over = sum(p > 25 for p in sel)
        print(f"background samples {lo:>3}-{hi:<4} (2 ms of CPU each): {len(sel):>4} seconds, median p99 {sorted(sel)[len(sel)//2]:6.2f} ms, over 25 ms: {over} ({100*over/len(sel):.0f} %)")
