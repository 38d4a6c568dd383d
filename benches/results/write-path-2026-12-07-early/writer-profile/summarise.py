#!/usr/bin/env python3
# summarise.py WRITER.perf-script.gz: the writer threads' samples by kind (a sample's whole stack decides).
import collections, gzip, sys
stacks, cur = [], []
for line in gzip.open(sys.argv[1], "rt", errors="replace"):
    line = line.rstrip()
    if not line:
        if cur: stacks.append(cur)
        cur = []
    elif line[0] in " \t":
        parts = line.strip().split(" ", 1)
        if len(parts) > 1: cur.append(parts[1])
    else:
        cur = []
if cur: stacks.append(cur)
def kind(st):
    s = " ".join(st)
    if "fdatasync" in s or ("persist" in s and "sync" in s): return "the sync (persist, fdatasync, the disk's doorbell)"
    if "io_completed" in s or "IOFlushed" in s: return "callbacks"
    if "lz4" in s or "SkipList" in s or "append_entry" in s or "ext4" in s or "generic_perform_write" in s or "Batch" in s: return "fjall's write (journal, memtable, lz4)"
    if "recv" in s or "futex" in s or "schedule" in s: return "waiting for work (recv, futex, schedule)"
    return "other (stack not resolved)"
c = collections.Counter(kind(st) for st in stacks)
n = sum(c.values())
for k, v in c.most_common(): print(f"{100*v/n:5.1f} %  {v:5d}  {k}")
print(f"{n} samples")
