#!/usr/bin/env python3
"""cpus-used.py [GLOB...]: for every compare that ran twinhub and etcd (the JSON `--out` files under benches/results,
by default those of 2026-12-06 and 2026-12-07), how many of the machine's CPUs each system kept busy (servers and
load generator together) and what that says about the 3x line: the ratio twinhub would have had using as many CPUs
as etcd did, and how much less server CPU per update twinhub would need for 3x with the CPUs it did use."""
import glob, json, statistics as st, sys

patterns = sys.argv[1:] or ['benches/results/write-path-2026-12-0[67]*/**/*.json']
rows = []
for f in sorted({f for p in patterns for f in glob.glob(p, recursive=True)}):
    try:
        d = json.load(open(f))
    except Exception:
        continue
    if not isinstance(d, dict) or 'twinhub' not in d or 'etcd' not in d:
        continue
    t, e = d['twinhub'], d['etcd']
    if 'cpu' not in t or 'cpu' not in e:
        continue
    def used(s):
        c = s['cpu']
        return (c['servers_cpu_s'] + c['client_cpu_s']) / c['wall_s']
    def per(s):
        c = s['cpu']
        return c['servers_cpu_ms_per_update'] + c['client_cpu_ms_per_update']
    ratio = t['updates_per_s'] / e['updates_per_s']
    ut, ue = used(t), used(e)
    # server CPU per update that 3x etcd's rate would allow, with the CPUs twinhub kept busy and its client's cost
    need = ut / (3 * e['updates_per_s']) * 1000 - t['cpu']['client_cpu_ms_per_update']
    cut = 1 - need / t['cpu']['servers_cpu_ms_per_update']
    rows.append(dict(run=f.split('results/')[-1], ratio=ratio, twinhub_cpus=ut, etcd_cpus=ue,
                     cpu_per_update_etcd_over_twinhub=per(e) / per(t), ratio_at_etcd_cpus=ratio * ue / ut,
                     server_ms_per_update=t['cpu']['servers_cpu_ms_per_update'], server_ms_needed=need, cut_needed=cut))
print(f"{'run':70} ratio  CPUs(t) CPUs(e) CPU/u e/t  ratio@e-CPUs  srv ms/u  needed  cut")
for r in rows:
    print(f"{r['run'][:70]:70} {r['ratio']:5.2f} {r['twinhub_cpus']:7.2f} {r['etcd_cpus']:7.2f} {r['cpu_per_update_etcd_over_twinhub']:9.2f}"
          f" {r['ratio_at_etcd_cpus']:13.2f} {r['server_ms_per_update']:9.4f} {r['server_ms_needed']:7.4f} {r['cut_needed']*100:4.0f} %")
print(f"runs: {len(rows)}")
for k, name in [('ratio', 'twinhub / etcd, updates/s'), ('twinhub_cpus', "CPUs busy, twinhub's run"),
                ('etcd_cpus', "CPUs busy, etcd's run"), ('cpu_per_update_etcd_over_twinhub', 'CPU per update (servers + load generator), etcd / twinhub'),
                ('ratio_at_etcd_cpus', 'twinhub / etcd had twinhub kept as many CPUs busy as etcd'),
                ('server_ms_per_update', "twinhub's server CPU ms per update"), ('server_ms_needed', '... that 3x would allow'),
                ('cut_needed', 'cut in server CPU per update that 3x needs')]:
    v = [r[k] for r in rows]
    if not v:
        break
    print(f"{name}: median {st.median(v):.3f}, range {min(v):.3f} to {max(v):.3f}")
