#!/usr/bin/env python3
# phases.py OUTDIR [TOP]: for each sweep of run.sh, the machine's perf samples in seconds 5-25 of the
# maximum (closed loop) and of the half-load phase, per 1,000 updates, by process and by symbol: what an
# update costs more at half load than at the maximum, and where.
import sys, re, subprocess, collections, glob
d = sys.argv[1]; top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
tot = {"max": collections.Counter(), "50%": collections.Counter()}
totc = {"max": collections.Counter(), "50%": collections.Counter()}
upd = {"max": 0, "50%": 0}; secs = {"max": 0, "50%": 0}
for err in sorted(glob.glob(f"{d}/sweep-*.err")):
    i = re.search(r"sweep-(\d+)\.err", err).group(1)
    win = {}
    for l in open(err):
        m = re.match(r"(\d+\.\d+) \[(max|50%)\]\s+(\d+)s\s+(\d+) ops/s", l)
        if not m: continue
        t, ph, s, ops = float(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        if ph == "max" and s == 1: win.pop("max", None)  # the warm-up restarts the counter
        if 5 < s <= 25:
            win.setdefault(ph, []).append((t - 1, t, ops))
    spans = {ph: (min(a for a, _, _ in w), max(b for _, b, _ in w), sum(o for _, _, o in w), len(w)) for ph, w in win.items()}
    for ph, (_, _, ops, n) in spans.items(): upd[ph] += ops; secs[ph] += n
    out = subprocess.run(["perf", "script", "-i", f"{d}/perf-{i}.data", "-F", "comm,time,ip,sym,dso", "--ns"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        mm = re.match(r"\s*(.+?)\s+(\d+\.\d+):\s+[0-9a-f]+\s*(.*?)\s*\((.*)\)\s*$", line)
        if not mm: continue
        t = float(mm.group(2)); comm = mm.group(1).strip(); sym = mm.group(3).strip() or "?"; dso = mm.group(4).split("/")[-1]
        for ph, (a, b, _, _) in spans.items():
            if a <= t < b:
                tot[ph][(sym, dso)] += 1; totc[ph][comm] += 1
for ph in tot: print(f"{ph}: {secs[ph]} s, {upd[ph]} updates, {sum(tot[ph].values())} samples, {1000*sum(tot[ph].values())/max(upd[ph],1):.2f} samples per 1,000 updates")
def per(ph, c, k): return 1000 * c[ph][k] / max(upd[ph], 1)
print("\nby thread name (samples per 1,000 updates: max, 50 %, difference)")
names = set(totc["max"]) | set(totc["50%"])
for k in sorted(names, key=lambda k: -(per("50%", totc, k) - per("max", totc, k)))[:15]:
    print(f"{per('max', totc, k):8.2f} {per('50%', totc, k):8.2f} {per('50%', totc, k) - per('max', totc, k):+8.2f}  {k}")
print("\nby symbol, largest increase")
keys = set(tot["max"]) | set(tot["50%"])
for k in sorted(keys, key=lambda k: -(per("50%", tot, k) - per("max", tot, k)))[:top]:
    print(f"{per('max', tot, k):8.2f} {per('50%', tot, k):8.2f} {per('50%', tot, k) - per('max', tot, k):+8.2f}  {k[0][:70]} [{k[1]}]")
