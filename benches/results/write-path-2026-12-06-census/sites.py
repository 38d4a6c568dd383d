"""sites.py under KEY [DEPTH] [N] | sites.py leaf KEY: where the samples under a frame go, in a folded profile.

$F names the profile (default: profile.folded.gz beside this script). For every stack with a frame
containing KEY, from the innermost such frame:
  under  the next DEPTH frames of our code or a library (generic core/alloc/std/tokio/futures glue skipped)
  leaf   the innermost frame, and the innermost frame of our own code
Shares are of all the profile's samples.
"""
import collections
import gzip
import os
import re
import sys

GLUE = ('core::', 'alloc::', '<core', '<alloc', 'std::', '<std', 'tokio::', '<tokio', 'futures', '<futures',
        '<F as', '<T as', '<&', '<Pin', '<S as')


def stacks(path, key):
    """(frames below the innermost frame containing key, innermost frame, count), and the total."""
    total, hits = 0, []
    for line in gzip.open(path, 'rt'):
        stack, n = line.rstrip().rsplit(' ', 1)
        n = int(n)
        total += n
        frames = stack.split(';')
        at = [k for k, x in enumerate(frames) if key in x]
        if at:
            hits.append((frames[at[-1] + 1:], frames[-1], n))
    return hits, total


def show(counter, total, top):
    for k, v in counter.most_common(top):
        print(f"{100 * v / total:5.2f} {k}")


def main():
    mode, key = sys.argv[1], sys.argv[2]
    path = os.environ.get('F', os.path.join(os.path.dirname(os.path.abspath(__file__)), 'profile.folded.gz'))
    hits, total = stacks(path, key)
    print(f"{100 * sum(n for _, _, n in hits) / total:.2f}%")
    if mode == 'under':
        depth = int(sys.argv[3]) if len(sys.argv) > 3 else 2
        by = collections.Counter()
        for below, _, n in hits:
            by[' > '.join(x[:70] for x in [f for f in below if not f.startswith(GLUE)][:depth])] += n
        show(by, total, int(sys.argv[4]) if len(sys.argv) > 4 else 30)
    else:
        leaves, ours = collections.Counter(), collections.Counter()
        for below, leaf, n in hits:
            leaves[leaf[:110]] += n
            own = [x for x in below if re.match(r'^<?twinhub', x)]
            ours[(own[-1] if own else '-')[:130]] += n
        show(leaves, total, 25)
        print('--- innermost our fn')
        show(ours, total, 30)


main()
