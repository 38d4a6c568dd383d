# sample.py OUT SECONDS PID...: every 0.1 s, per pid and thread name: cpu ticks; vda diskstats; Dirty/Writeback
import os, sys, time, json
out, secs, pids = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
def threads(pid):
    r = {}
    try:
        for t in os.listdir(f'/proc/{pid}/task'):
            try:
                s = open(f'/proc/{pid}/task/{t}/stat').read()
            except OSError:
                continue
            name = s[s.index('(')+1:s.rindex(')')]
            f = s[s.rindex(')')+2:].split()
            r[name] = r.get(name, 0) + int(f[11]) + int(f[12])
    except OSError:
        pass
    return r
def disk():
    for l in open('/proc/diskstats'):
        f = l.split()
        if f[2] == 'vda':
            return [int(x) for x in f[3:]]
def mem():
    d = {}
    for l in open('/proc/meminfo'):
        k, v = l.split(':')
        if k in ('Dirty', 'Writeback'):
            d[k] = int(v.split()[0])
    return d
end = time.time() + secs
with open(out, 'w') as o:
    while time.time() < end:
        o.write(json.dumps({'t': time.time(), 'p': {p: threads(p) for p in pids}, 'd': disk(), 'm': mem(), 's': open('/proc/stat').readline().split()[1:]}) + '\n')
        time.sleep(0.1)
