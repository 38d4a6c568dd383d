# summarize.py: the pairs of summary.txt (rows of `twinhub bench compare --systems twinhub`), direct over base.
import statistics as st
b, d = {}, {}
for r in (l.split() for l in open('summary.txt')):
    k, p = r[0], r[1]
    (b if k == 'base' else d)[p] = (float(r[3]), float(r[11]), float(r[6]))
for p in sorted(b, key=lambda s: int(s[4:])):
    print(p, 'base', b[p], 'direct', d[p], 'updates/s x%.3f  server CPU/update x%.3f' % (d[p][0] / b[p][0], d[p][1] / b[p][1]))
for name, x in (('base', b), ('direct', d)):
    print(name, 'mean updates/s %.0f, server CPU ms/update %.4f, p99 ms %.2f' % (
        st.mean(v[0] for v in x.values()), st.mean(v[1] for v in x.values()), st.mean(v[2] for v in x.values())))
print('median of pair ratios: updates/s %.3f, server CPU/update %.3f' % (
    st.median(d[p][0] / b[p][0] for p in b), st.median(d[p][1] / b[p][1] for p in b)))
