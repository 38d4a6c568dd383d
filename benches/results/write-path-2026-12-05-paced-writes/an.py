import json, sys, collections
L = sys.argv[1]
d = json.load(open(f'/tmp/tl/out/{L}.json'))
ser = d['results']['series']
S = [json.loads(l) for l in open(f'/tmp/tl/out/{L}.samples')]
t0 = S[0]['t'] + float(sys.argv[2]) if len(sys.argv) > 2 else S[0]['t'] + 3.0
pids = list(S[0]['p'])
def at(t):
    best = min(S, key=lambda s: abs(s['t'] - t)); return best
print('sec p99 | per node cpu% (top threads) | disk wr/s KB/s ioms dirtyKB')
for s in ser:
    te = t0 + s['t_s']; a = at(te - 1.0); b = at(te)
    dt = b['t'] - a['t']
    parts = []
    for p in pids:
        ta, tb = a['p'][p], b['p'][p]
        tot = sum(tb.values()) - sum(ta.values())
        top = sorted(((tb[k] - ta.get(k, 0), k) for k in tb), reverse=True)[:3]
        parts.append('%3.0f%% %s' % (tot / dt, ','.join('%s:%d' % (k[:10], v) for v, k in top if v > 0)))
    da, db = a['d'], b['d']
    wr = (db[4] - da[4]) / dt; kb = (db[6] - da[6]) / 2 / dt; io = (db[9] - da[9]) / dt
    print('%4.1f %5.1f | %s | %5.0f %6.0f %4.0f %6d %s' % (s['t_s'], s['p99_ms'], ' | '.join(parts), wr, kb, io, b['m']['Dirty'], b['m']['Writeback']))
