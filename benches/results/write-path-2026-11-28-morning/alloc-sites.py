#!/usr/bin/env python3
"""Allocation census by call site from a uprobe recording of mimalloc's allocation entry point.

    perf probe -x path/to/twinhub --add mi_malloc_aligned
    perf record -e probe_twinhub:mi_malloc_aligned -c 20 --call-graph dwarf,16384 -p NODE_PIDS -o alloc.data -- sleep 5
    perf script -i alloc.data -F comm,ip,sym > alloc.txt
    alloc-sites.py alloc.txt

Prints the share of allocations per area of the server and per first frame that is not allocator,
collection or serializer glue. Uprobes slow the nodes down a lot: use the shares, not the rates.
"""
import collections
import re
import sys

GLUE = re.compile(
    r'^(mi_|_mi|alloc::|__rust|core::|<alloc|<core|std::alloc|mimalloc|<mimalloc|\[unknown\]|<T as alloc|<\[|'
    r'<str as alloc|<u8 as|bytes::|<bytes|hashbrown|<hashbrown|serde_json::|<serde_json|<&mut serde_json|'
    r'postcard|<postcard|<&mut postcard|serde_core|<serde|<std::io|std::io|<&mut|<&)')
AREAS = [('apply', 'ShardState::apply'), ('front door (HTTPS)', 'twinhub::http::'),
         ('inter-node transport', 'twinhub::cluster::transport'), ('Raft storage', 'twinhub::storage'),
         ('twin actor', 'twinhub::twin::'), ('openraft', 'openraft::'), ('h2/hyper', 'h2::|hyper::'),
         ('rustls', 'rustls'), ('tokio', 'tokio::')]

sites, areas, total = collections.Counter(), collections.Counter(), 0


def flush(frames):
    global total
    if not frames:
        return
    total += 1
    own = [f for f in frames if not GLUE.search(f)]
    sites[(own[0] if own else frames[0])[:120]] += 1
    text = ' '.join(frames)
    areas[next((name for name, p in AREAS if re.search(p, text)), 'other')] += 1


frames = []
for line in open(sys.argv[1]):
    line = line.rstrip('\n')
    if not line.strip():
        flush(frames)
        frames = []
        continue
    m = re.match(r'\s+[0-9a-f]+\s+(.*?)(\+0x[0-9a-f]+)?( \(.*\))?$', line)
    if m:
        frames.append(m.group(1))
flush(frames)
print(f"{total} sampled allocations")
for k, v in areas.most_common():
    print(f"{v / total * 100:5.1f} %  {k}")
print()
for k, v in sites.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
    print(f"{v / total * 100:5.1f} %  {k}")
