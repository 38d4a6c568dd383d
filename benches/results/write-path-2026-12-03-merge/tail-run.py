#!/usr/bin/env python3
"""tail-run.py BINDIR OUTDIR [latency-sweep args]: `twinhub bench latency-sweep --percents 50
--duration 60` with the cluster's state recorded as it runs, for tail.py to read:
- every node's /metrics once a second (scrape.jsonl: the raw samples per node, and per-thread CPU
  ticks of the node processes by thread name, /proc/diskstats of vda, a few /proc/vmstat counters);
- every file the nodes delete or shrink, polled every 0.2 s (gone.jsonl, with its last size)."""
import collections, json, os, re, ssl, subprocess, sys, threading, time, urllib.request

bd, w, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
os.makedirs(w, exist_ok=True)
env = dict(os.environ, TWINHUB_BIN=f'{bd}/twinhub')
log = open(f'{w}/s.log', 'w')
p = subprocess.Popen([f'{bd}/twinhub', 'bench', 'latency-sweep', '--percents', '50', '--duration', '60', *extra,
                      '--out', f'{w}/s.json'], stdout=open(f'{w}/s.txt', 'w'), stderr=log, env=env)
while 'closed loop' not in open(f'{w}/s.log').read():
    assert p.poll() is None, open(f'{w}/s.log').read()[-2000:]
    time.sleep(0.5)
time.sleep(2)
pids = subprocess.run(['pgrep', '-f', f'{bd}/twinhub serve'], capture_output=True, text=True).stdout.split()
ports, ddirs = [], []
for pid in pids:
    cmd = open(f'/proc/{pid}/cmdline').read().split('\0')
    cfg = open(cmd[cmd.index('--config') + 1]).read()
    ports.append(re.search(r'http_listen = "([^"]+)"', cfg).group(1))
    ddirs.append(re.search(r'data_dir = "([^"]+)"', cfg).group(1))
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE

def threads():
    ticks = collections.Counter()
    for pid in pids:
        for t in os.listdir(f'/proc/{pid}/task') if os.path.exists(f'/proc/{pid}/task') else []:
            try:
                st = open(f'/proc/{pid}/task/{t}/stat').read()
            except OSError:
                continue
            f = st[st.rindex(')') + 2:].split()
            ticks[st[st.index('(') + 1:st.rindex(')')]] += int(f[11]) + int(f[12])
    return dict(ticks)

def disk():
    for line in open('/proc/diskstats'):
        f = line.split()
        if f[2] == 'vda':
            return [int(x) for x in f[3:14]]

def vm():
    keep = ('nr_dirty', 'nr_writeback', 'pgfault', 'pgmajfault', 'thp_fault_alloc')
    return {k: int(v) for k, v in (l.split() for l in open('/proc/vmstat')) if k in keep}

gone = open(f'{w}/gone.jsonl', 'w')

def watch():
    prev = {}
    while p.poll() is None:
        cur = {}
        for k, dd in enumerate(ddirs):
            for root, _, files in os.walk(dd):
                for f in files:
                    try:
                        cur[os.path.join(root, f)] = (k, os.path.getsize(os.path.join(root, f)))
                    except OSError:
                        pass
        t = time.time()
        for path, (k, size) in prev.items():
            if path not in cur:
                gone.write(json.dumps({'t': t, 'node': k, 'path': path[len(ddirs[k]):], 'size': size}) + '\n')
            elif cur[path][1] < size:
                gone.write(json.dumps({'t': t, 'node': k, 'path': path[len(ddirs[k]):], 'shrunk': size - cur[path][1]}) + '\n')
        gone.flush()
        prev = cur
        time.sleep(0.2)

threading.Thread(target=watch, daemon=True).start()
out = open(f'{w}/scrape.jsonl', 'w')
while p.poll() is None:
    t, rows = time.time(), []
    for a in ports:
        try:
            text = urllib.request.urlopen(f'https://{a}/metrics', context=ctx, timeout=2).read().decode()
        except Exception:
            continue
        d = {}
        for line in text.splitlines():
            if line and not line.startswith('#'):
                name, val = line.rsplit(' ', 1)
                try:
                    d[name] = float(val)
                except ValueError:
                    pass
        rows.append(d)
    out.write(json.dumps({'t': t, 'nodes': rows, 'threads': threads(), 'disk': disk(), 'vm': vm()}) + '\n')
    out.flush()
    time.sleep(max(0, 1 - (time.time() - t)))
print(open(f'{w}/s.txt').read())
