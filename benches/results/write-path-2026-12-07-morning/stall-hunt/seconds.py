#!/usr/bin/env python3
# seconds.py OUTDIR [P99_MS]: every measured second of the half-load phases of run.sh's sweeps whose p99
# was over P99_MS (default 25), beside what the machine (steal), the disk and the leader node (fsyncs a
# second and their mean, a snapshot taken in that second or the one before) did in it; then how often a
# leader snapshot fell in such a second against in any second.
import sys, re, datetime, glob, collections
d = sys.argv[1]; lim = float(sys.argv[2]) if len(sys.argv) > 2 else 25.0
T = lambda s: datetime.datetime.strptime(s, "%H:%M:%S")
steal = {}
for l in open(f"{d}/machine.txt"):
    m = re.match(r"(\S+) .*steal=([\d.]+)", l)
    if m: steal[T(m.group(1))] = float(m.group(2))
lead = {}  # time -> (fsync/s, mean ms, snapshot index) of the node leading at that time
for l in open(f"{d}/metrics.txt"):
    m = re.match(r"(\S+) n\d+ .*shard_is_leader=([1-9]).*shard_snapshot_index=(\d+).*storage_fsync=(\d+)/s,([\d.]+)ms", l)
    if m: lead[T(m.group(1))] = (int(m.group(4)), float(m.group(5)), int(m.group(3)))
def snap_at(t):
    a, b = lead.get(t - datetime.timedelta(seconds=2)), lead.get(t)
    return a is not None and b is not None and a[2] != b[2]
ends = {}
for l in open(f"{d}/marks.txt"):
    m = re.match(r"(\d+) (\S+) 50%", l)
    if m: ends[int(m.group(1))] = T(m.group(2))
slow = 0; slow_snap = 0; all_s = 0; all_snap = 0
print(f"{'sweep':>5} {'second':>6} {'time':>8} {'p99 ms':>8} {'steal %':>7} {'leader fsync/s':>14} {'fsync ms':>8} {'leader snapshot':>15}")
for i, end in sorted(ends.items()):
    secs = [l for l in open(f"{d}/sweep-{i}.err") if l.startswith("[50%]")][2:]  # after the 2 s warm-up
    start = end - datetime.timedelta(seconds=len(secs) + 1)
    for k, l in enumerate(secs):
        p99 = float(re.search(r"p99\s+([\d.]+) ms", l).group(1))
        t = start + datetime.timedelta(seconds=k + 1)
        s = snap_at(t); all_s += 1; all_snap += s
        if p99 > lim:
            slow += 1; slow_snap += s
            f = lead.get(t, (0, 0, 0))
            print(f"{i:>5} {k+1:>6} {t.strftime('%H:%M:%S'):>8} {p99:>8.2f} {steal.get(t, float('nan')):>7.1f} {f[0]:>14} {f[1]:>8.2f} {'yes' if s else '':>15}")
print(f"\nseconds over {lim} ms: {slow}, with a leader snapshot in it or the second before: {slow_snap}; all seconds: {all_s}, with one: {all_snap}")
