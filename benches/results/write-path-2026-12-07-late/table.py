"""table.py LABEL=FILE.json…: one markdown row per compare (`twinhub bench compare --out`) that ran twinhub,
etcd and NATS with fsync: updates/s, the issue's four ratios, each system's server CPU per update and the
hypervisor's steal over its window (the window's average, %)."""
import json
import sys

for arg in sys.argv[1:]:
    label, path = arg.split("=", 1)
    d = json.load(open(path))
    t, e, n = d["twinhub"], d["etcd"], d["nats"]
    cpu = lambda s: s["cpu"]["servers_cpu_ms_per_update"]
    steal = lambda s: s.get("steal_pct") or 0.0
    order = "twinhub first" if list(d).index("twinhub") < list(d).index("etcd") else "twinhub last"
    print(f"| {label} | {order} | {t['updates_per_s']:,.0f} | {e['updates_per_s']:,.0f} | {n['updates_per_s']:,.0f} "
          f"| {t['updates_per_s'] / e['updates_per_s']:.2f} | {t['updates_per_s'] / n['updates_per_s']:.2f} "
          f"| {cpu(t) / cpu(e):.2f} | {t['p99_ms'] / e['p99_ms']:.2f} "
          f"| {cpu(t):.3f} / {cpu(e):.3f} / {cpu(n):.3f} | {steal(t):.1f} / {steal(e):.1f} / {steal(n):.1f} "
          f"| {t['errors'] + e['errors'] + n['errors']} |")
