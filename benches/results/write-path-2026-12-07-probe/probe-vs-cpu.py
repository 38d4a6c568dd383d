#!/usr/bin/env python3
"""probe-vs-cpu.py GLOB...: for every compare JSON (--out) that carries the machine probe, each system's
server CPU per update against the probe taken just before it; then, per system, how closely its CPU per
update follows each probe measurement (Pearson's r, and the slope as % CPU per % probe, both over the
runs given) and with the hypervisor's steal in the system's own window, and the runs' twinhub/etcd and twinhub/NATS rates against the probe."""
import glob
import json
import sys

KEYS = ["handoff_same_cpu_us", "handoff_cross_cpu_us", "compute_ns_per_step", "walk_small_ns_per_step", "walk_large_ns_per_step"]
SHORT = {"handoff_same_cpu_us": "hand-off 1 CPU", "handoff_cross_cpu_us": "hand-off 2 CPUs", "compute_ns_per_step": "compute",
         "walk_small_ns_per_step": "walk 16 MiB", "walk_large_ns_per_step": "walk 128 MiB"}


def pearson(xs, ys):
    n = len(xs)
    if n < 3:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


def partial(xs, ys, zs):
    """r of xs and ys with zs held fixed."""
    rxy, rxz, ryz = pearson(xs, ys), pearson(xs, zs), pearson(ys, zs)
    d = ((1 - rxz ** 2) * (1 - ryz ** 2)) ** 0.5
    return (rxy - rxz * ryz) / d if d > 0 else float("nan")


def elasticity(xs, ys):
    """Least-squares slope of log-ish relative change: % of y per % of x around the means."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return float("nan")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope * mx / my


rows = []
files = sorted({f for g in sys.argv[1:] for f in glob.glob(g)})
for f in files:
    try:
        d = json.load(open(f))
    except (OSError, ValueError):
        continue
    for name in ("twinhub", "etcd", "nats"):
        s = d.get(name)
        if not isinstance(s, dict) or not isinstance(s.get("machine_probe"), dict):
            continue
        p = s["machine_probe"]
        rows.append({"file": f, "system": name, "rate": s["updates_per_s"], "cpu": s["cpu"]["servers_cpu_ms_per_update"],
                     "steal": s.get("steal_pct") or 0.0, **{k: p.get(k) for k in KEYS}})

print(f"{'file':<44} {'system':<8} {'updates/s':>9} {'srv ms/u':>8} {'steal':>5} " + " ".join(f"{SHORT[k]:>15}" for k in KEYS))
for r in rows:
    print(f"{r['file'][-44:]:<44} {r['system']:<8} {r['rate']:>9.0f} {r['cpu']:>8.4f} {r['steal']:>5.1f} "
          + " ".join(f"{(r[k] if r[k] is not None else float('nan')):>15.3f}" for k in KEYS))

print("\nper system: r (Pearson) and % change of server CPU per update for 1 % of the probe measurement, over its runs;"
      " r with the window's steal held fixed in brackets; last, r against the steal in the system's own window")
for name in ("twinhub", "etcd", "nats"):
    rs = [r for r in rows if r["system"] == name and all(r[k] is not None for k in KEYS)]
    if len(rs) < 3:
        continue
    cells = []
    for k in KEYS:
        xs, ys = [r[k] for r in rs], [r["cpu"] for r in rs]
        zs = [r["steal"] for r in rs]
        cells.append(f"{SHORT[k]} r={pearson(xs, ys):+.2f} (steal held: {partial(xs, ys, zs):+.2f}) e={elasticity(xs, ys):+.2f}")
    xs, ys = [r["steal"] for r in rs], [r["cpu"] for r in rs]
    cells.append(f"steal in the window r={pearson(xs, ys):+.2f}")
    cpus = [r["cpu"] for r in rs]
    print(f"  {name:<8} n={len(rs)} CPU/update {min(cpus):.4f}-{max(cpus):.4f}: " + "; ".join(cells))

print("\nper run: twinhub / peer rates")
by_file = {}
for r in rows:
    by_file.setdefault(r["file"], {})[r["system"]] = r
for f, s in by_file.items():
    if "twinhub" in s and "etcd" in s:
        nats = f"{s['twinhub']['rate'] / s['nats']['rate']:.2f}" if "nats" in s else "-"
        print(f"  {f[-44:]:<44} vs etcd {s['twinhub']['rate'] / s['etcd']['rate']:.2f} vs nats {nats}"
              f"  hand-off 1 CPU before twinhub {s['twinhub']['handoff_same_cpu_us']:.2f} µs, walk 16 MiB {s['twinhub']['walk_small_ns_per_step']:.0f} ns")
