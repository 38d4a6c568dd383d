#!/usr/bin/env python3
"""Shares of a profile's samples by layer, and in µs of server CPU per update.
   python3 categories.py FOLDED[.gz] [CPU_US_PER_UPDATE]
FOLDED: folded stacks with the thread name as the root frame, as scripts/flamegraph.sh keeps them
(inferno-collapse-perf) or as ../write-path-2026-12-01-events/fold.py writes them.
A stack counts once, in the first category whose pattern matches any of its frames, in this order."""
import gzip, sys, re, collections
CATS = [
    ('fsync', r'do_fsync|__x64_sys_fsync|fsync'),
    ('group-commit writer, other', r'group_commit::Writer'),
    ('state machine apply', r'sm::worker::Worker.*apply|ShardState::apply'),
    ('front door (HTTP/1.1, TLS, handler, forwarding)', r'hyper::proto::h1|http::twins::write|axum::'),
    ('inter-node transport', r'cluster::transport'),
    ('openraft core', r'openraft::core::raft_core'),
    ('openraft replication', r'openraft::replication'),
    ('log store', r'storage::log_store'),
    ('change feed and broker', r'notify::|rumqttd|broker'),
    ('tokio scheduler (parking, waking)', r'tokio::runtime::scheduler|park|epoll_wait'),
    ('fjall background', r'fjall'),
]
f = sys.argv[1]
cpu = float(sys.argv[2]) if len(sys.argv) > 2 else None
tot = 0
acc = collections.Counter()
for line in (gzip.open(f, 'rt') if f.endswith('.gz') else open(f)):
    stack, n = line.rsplit(' ', 1)
    n = int(n)
    tot += n
    frames = stack.split(';')[1:]
    for name, rx in CATS:
        if any(re.search(rx, x) for x in frames):
            acc[name] += n
            break
    else:
        acc['other'] += n
print(f'{tot} samples')
for k, v in acc.most_common():
    print(f'  {k:50s} {100 * v / tot:5.1f} %' + (f'  {cpu * v / tot:6.1f} µs/update' if cpu else ''))
