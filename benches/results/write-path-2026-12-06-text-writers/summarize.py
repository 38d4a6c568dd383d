# summarize.py: the interleaved pairs of abba/ (75cdd87's server against the base) and abba2/ (8ae297a's
# server against the base), each run a `twinhub bench compare --systems twinhub` JSON. In both a = base
# (the server of 209aa63), b = the change; both sides of a series run the change's load generator.
import json, statistics as st
rows = []
for d in ('abba', 'abba2'):
    for i in range(1, 5):
        r = {}
        for who, k in (('base', 'a'), ('new', 'b')):
            t = json.load(open(f'{d}/{k}{i}.json'))['twinhub']
            r[who] = (t['updates_per_s'], t['cpu']['servers_cpu_ms_per_update'], t['p99_ms'])
        rows.append((d, i, r))
for d, i, r in rows:
    print(f"{d} pair {i}: base {r['base'][0]:7.0f}/s {r['base'][1]:.3f} ms  new {r['new'][0]:7.0f}/s {r['new'][1]:.3f} ms"
          f"  updates/s x{r['new'][0] / r['base'][0]:.3f}  CPU/update x{r['new'][1] / r['base'][1]:.3f}")
for sel, label in ((('abba',), '75cdd87, 4 pairs'), (('abba2',), '8ae297a, 4 pairs'), (('abba', 'abba2'), 'all 8 pairs')):
    rs = [r for d, _, r in rows if d in sel]
    m = lambda who, j: st.mean(r[who][j] for r in rs)
    print(f"{label}: base {m('base', 0):.0f}/s {m('base', 1):.4f} ms p99 {m('base', 2):.2f}; new {m('new', 0):.0f}/s "
          f"{m('new', 1):.4f} ms p99 {m('new', 2):.2f}; median pair ratio updates/s "
          f"{st.median(r['new'][0] / r['base'][0] for r in rs):.3f}, CPU/update {st.median(r['new'][1] / r['base'][1] for r in rs):.3f}; "
          f"lower CPU/update in {sum(r['new'][1] < r['base'][1] for r in rs)} of {len(rs)}")
