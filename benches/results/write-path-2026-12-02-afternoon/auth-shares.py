#!/usr/bin/env python3
"""Shares of all node samples spent checking SAS tokens and inter-node signatures, from folded stacks
(fold.py of ../write-path-2026-12-01-events, thread name as the root frame).
   python3 auth-shares.py FOLDED.gz ..."""
import gzip, re, sys, collections
for f in sys.argv[1:]:
    tot = 0
    c = collections.Counter()
    for line in gzip.open(f, 'rt'):
        stack, _, n = line.rstrip().rpartition(' ')
        n = int(n)
        tot += n
        if re.search(r'Policies::(verify_credential|authorize|signed)', stack):
            c['SAS tokens (policies)'] += n
            if 'SasToken::parse' in stack:
                c['  of which parsing'] += n
            if 'verify_signature' in stack:
                c['  of which HMAC'] += n
        if 'transport::auth' in stack:
            c['inter-node signatures'] += n
    print(f'{f}: {tot} samples; ' + '; '.join(f'{k} {100 * v / tot:.2f} %' for k, v in c.items()))
