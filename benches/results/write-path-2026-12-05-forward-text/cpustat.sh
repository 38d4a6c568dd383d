#!/bin/bash
# cpustat.sh BINDIR OUT: a twinhub-only compare; /proc/stat sampled 10 s and 25 s into it (the measured window), shares printed
B=$1; O=$2
$B/twinhub-bench compare --bin $B/twinhub --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out $O.json > $O.txt 2> $O.log &
P=$!
until grep -q "closed loop" $O.log 2>/dev/null; do sleep 1; done
sleep 10; head -1 /proc/stat > $O.stat1; sleep 15; head -1 /proc/stat > $O.stat2
wait $P
python3 - $O.stat1 $O.stat2 <<'PY'
import sys
a=list(map(int,open(sys.argv[1]).read().split()[1:])); b=list(map(int,open(sys.argv[2]).read().split()[1:]))
names=['user','nice','system','idle','iowait','irq','softirq','steal','guest','guest_nice']
d=[y-x for x,y in zip(a,b)]; t=sum(d[:8])
print(' '.join('%s %.1f%%'%(n,100*v/t) for n,v in zip(names,d[:8])))
PY
grep -E '^twinhub ' $O.txt
