"""futex-callers.py FOLDED.gz: which threads and call sites spend the samples that reach a futex system
call, in a folded profile (thread name first), as a share of all samples and by the three frames above
the first syscall or futex frame."""
import collections
import gzip
import sys

by_thread, by_site, total, futex = collections.Counter(), collections.Counter(), 0, 0
for line in gzip.open(sys.argv[1], 'rt'):
    stack, n = line.rsplit(' ', 1)
    n = int(n)
    total += n
    if 'futex' not in stack:
        continue
    futex += n
    frames = stack.split(';')
    by_thread[frames[0]] += n
    i = next((j for j, f in enumerate(frames) if 'futex' in f or f.startswith('syscall') or 'entry_SYSCALL' in f),
             len(frames))
    by_site[frames[0] + ' | ' + ' > '.join(f[:60] for f in frames[max(1, i - 3):i])] += n
print(f'futex: {100 * futex / total:.1f} % of {total} samples')
for t, n in by_thread.most_common():
    print(f'{100 * n / total:5.1f} %  {t}')
print()
for s, n in by_site.most_common(12):
    print(f'{100 * n / total:5.1f} %  {s}')
