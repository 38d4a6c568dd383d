#!/usr/bin/env python3
# summary.py OUTDIR: per mode of ab.sh, the half-load phases' p99 and how many of their measured seconds had a p99 over 25 ms.
import sys, re, collections
d = sys.argv[1]; by = collections.defaultdict(list); slow = collections.Counter(); total = collections.Counter()
for l in open(f"{d}/marks.txt"):
    m = re.match(r"(\d+) \S+ 50% (\S+ ){4}(\S+) .* mode (\S+)", l)
    if not m: continue
    i, p99, mode = int(m.group(1)), float(m.group(3)), m.group(4)
    by[mode].append(p99)
    for x in [x for x in open(f"{d}/sweep-{i}.err") if x.startswith("[50%]")][2:]:
        total[mode] += 1; slow[mode] += float(re.search(r"p99\s+([\d.]+) ms", x).group(1)) > 25
for mode, v in by.items():
    print(f"{mode:>6}: p99 at 50 % {' / '.join(f'{x:.2f}' for x in v)} ms; seconds over 25 ms: {slow[mode]} of {total[mode]}")
