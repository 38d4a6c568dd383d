# summarize.py: the interleaved pairs of abba/, abba2/ (the first form of the change) and abba3/ (the
# committed form), each run a `twinhub bench compare --systems twinhub` JSON; tree over base.
# In abba/ and abba3/ a = base (a1e63da), b = the change; in abba2/ the other way round.
import json, statistics as st
rows = []
for d, base in (('abba', 'a'), ('abba2', 'b'), ('abba3', 'a')):
    tree = 'b' if base == 'a' else 'a'
    for i in range(1, 5):
        r = {}
        for who, k in (('base', base), ('tree', tree)):
            t = json.load(open(f'{d}/{k}{i}.json'))['twinhub']
            r[who] = (t['updates_per_s'], t['cpu']['servers_cpu_ms_per_update'], t['p99_ms'])
        rows.append((d, i, r))
for d, i, r in rows:
    print(f"{d} pair {i}: base {r['base'][0]:7.0f}/s {r['base'][1]:.3f} ms  tree {r['tree'][0]:7.0f}/s {r['tree'][1]:.3f} ms"
          f"  updates/s x{r['tree'][0] / r['base'][0]:.3f}  CPU/update x{r['tree'][1] / r['base'][1]:.3f}")
for sel, label in ((('abba', 'abba2', 'abba3'), 'all 12 pairs'), (('abba3',), 'the committed form, 4 pairs')):
    rs = [r for d, _, r in rows if d in sel]
    m = lambda who, j: st.mean(r[who][j] for r in rs)
    print(f"{label}: base {m('base', 0):.0f}/s {m('base', 1):.4f} ms p99 {m('base', 2):.2f}; tree {m('tree', 0):.0f}/s "
          f"{m('tree', 1):.4f} ms p99 {m('tree', 2):.2f}; median pair ratio updates/s "
          f"{st.median(r['tree'][0] / r['base'][0] for r in rs):.3f}, CPU/update {st.median(r['tree'][1] / r['base'][1] for r in rs):.3f}; "
          f"lower CPU/update in {sum(r['tree'][1] < r['base'][1] for r in rs)} of {len(rs)}")
