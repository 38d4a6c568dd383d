#!/usr/bin/env python3
import sys, collections
# perf script output -> folded stacks (root;...;leaf count), with the thread/comm as root
agg = collections.Counter()
comm = None; frames = []
def flush():
    global frames, comm
    if comm is not None:
        stack = [comm] + [f for f in reversed(frames)]
        agg[';'.join(stack)] += 1
    frames = []; comm = None
for line in sys.stdin:
    if not line.strip():
        flush(); continue
    if not line.startswith((' ', '\t')):
        flush()
        comm = line.split()[0]
        continue
    parts = line.strip().split(None, 1)
    if len(parts) == 2:
        sym = parts[1]
        # strip offset and module
        if ' (' in sym: sym = sym[:sym.rindex(' (')]
        if '+0x' in sym: sym = sym[:sym.rindex('+0x')]
        frames.append(sym.replace(';', ':'))
flush()
for k, v in agg.items():
    print(k, v)
