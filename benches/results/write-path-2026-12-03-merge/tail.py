#!/usr/bin/env python3
"""tail.py RUN_DIR...: for each OUTDIR of tail-run.py, the half-load phase's p99 and slow seconds, and
the group-commit fsyncs of 25 ms or more in that phase, per node, by the second the nodes' /metrics
were scraped (each node's `twinhub_storage_fsync_seconds` histogram), with the files of 1 MB or more
that the nodes deleted in the same window (if the run recorded them)."""
import json, os, sys

def buckets(node, name):
    return {k.split('le="')[1].split('"')[0]: v for k, v in node.items() if k.startswith(name + '_bucket')}

def patch_count(r):
    return sum(v for n in r['nodes'] for k, v in n.items()
               if k.startswith('twinhub_http_request_duration_seconds_count') and 'PATCH' in k)

for run in sys.argv[1:]:
    sweep = json.load(open(f'{run}/s.json'))
    half = [p for p in sweep['phases'] if p['phase'].startswith('50')][0]
    rows = [json.loads(l) for l in open(f'{run}/scrape.jsonl')]
    rows = [r for r in rows if len(r['nodes']) == 3]
    target = half['target_rate']
    # The open-loop phase: the longest run of scrapes whose PATCH rate is within 15 % of its target
    # (a second of the closed loop that a stall slowed to that rate is not part of it).
    window, run_ = [], []
    for a, b in zip(rows, rows[1:]):
        rate = (patch_count(b) - patch_count(a)) / (b['t'] - a['t'])
        run_ = run_ + [(a, b)] if abs(rate - target) < 0.15 * target else []
        if len(run_) > len(window):
            window = run_
    slow_seconds = [round(s['p99_ms']) for s in half['series'] if s['p99_ms'] > 20]
    print(f"{os.path.basename(run)}: 50 % = {half['achieved_per_s']:.0f}/s, p50 {half['p50_ms']:.2f} ms, "
          f"p99 {half['p99_ms']:.2f} ms; seconds over 20 ms: {len(slow_seconds)} of {len(half['series'])} {slow_seconds}")
    t0 = window[0][0]['t'] if window else 0
    stalls = []
    for a, b in window:
        per_node = []
        for na, nb in zip(a['nodes'], b['nodes']):
            ba, bb = buckets(na, 'twinhub_storage_fsync_seconds'), buckets(nb, 'twinhub_storage_fsync_seconds')
            total = bb['+Inf'] - ba['+Inf']
            over = {le: round(total - (bb[le] - ba[le])) for le in ('0.025', '0.05', '0.1') if le in bb}
            per_node.append(over)
        if any(o.get('0.025') for o in per_node):
            every = all(o.get('0.025') for o in per_node)
            stalls.append((a['t'] - t0, every, per_node))
    # The phase's first second of results is about 4 s into this window (the open loop's 3 s warm-up,
    # and a scrape counts the second before it).
    print(f"  {len(window)} s of scrapes in the phase; seconds with a fsync of >= 25 ms: {len(stalls)}, "
          f"on all three nodes at once: {sum(1 for s in stalls if s[1])}")
    for t, every, per_node in stalls:
        desc = ', '.join(f"node {i + 1}: " + '/'.join(str(o.get(le, 0)) for le in ('0.025', '0.05', '0.1'))
                         for i, o in enumerate(per_node))
        print(f"    +{t:5.1f} s  fsyncs over 25/50/100 ms  {desc}")
    gone = f'{run}/gone.jsonl'
    if os.path.exists(gone) and window:
        t1 = window[-1][1]['t']
        big = [json.loads(l) for l in open(gone)]
        big = [g for g in big if t0 <= g['t'] <= t1 and g.get('size', 0) >= 1 << 20]
        print(f"  files of >= 1 MB deleted in the phase: {len(big)}")
        for g in big:
            print(f"    +{g['t'] - t0:5.1f} s  node {g['node'] + 1} {g['path']} {g['size'] / 1e6:.1f} MB")
