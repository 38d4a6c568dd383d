#!/usr/bin/env python3
# rounds-run.py BINDIR LABEL [extra compare args]: a twinhub-only compare (files in /tmp/rounds/LABEL); every
# node's /metrics scraped 11 s and 31 s after the closed loop starts (its 5 s warm-up over); prints the counters' growth per update, the snapshot counters among them (encodes, their time, their bytes).
import subprocess,sys,time,re,os,ssl,urllib.request,json,collections
bd,label,extra=sys.argv[1],sys.argv[2],sys.argv[3:]
w=f'/tmp/rounds/{label}'; os.makedirs(w,exist_ok=True)
env=dict(os.environ,TWINHUB_BIN=f'{bd}/twinhub')
log=open(f'{w}/c.log','w')
p=subprocess.Popen([f'{bd}/twinhub','bench','compare','--systems','twinhub','--duration','30','--concurrency','64','--twins','10000','--value-bytes','200',*extra,'--out',f'{w}/c.json'],stdout=open(f'{w}/c.txt','w'),stderr=log,env=env)
while 'closed loop' not in open(f'{w}/c.log').read():
    assert p.poll() is None, open(f'{w}/c.log').read()[-2000:]
    time.sleep(0.5)
time.sleep(11)
ports=[]
for pid in subprocess.run(['pgrep','-f',f'{bd}/twinhub serve'],capture_output=True,text=True).stdout.split():
    cmd=open(f'/proc/{pid}/cmdline').read().split('\0')
    cfg=cmd[cmd.index('--config')+1]
    ports.append(re.search(r'http_listen = "([^"]+)"',open(cfg).read()).group(1))
ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE
def scrape():
    tot=collections.Counter()
    for a in ports:
        for line in urllib.request.urlopen(f'https://{a}/metrics',context=ctx).read().decode().splitlines():
            if line.startswith('#') or not line.strip(): continue
            name,val=line.rsplit(' ',1)
            base=name.split('{')[0]
            try: v=float(val)
            except: continue
            if base.endswith('_count') or base.endswith('_total') or base.endswith('_sum'):
                key=base
                if 'route=' in name and 'twins/{id}' in name and 'PATCH' in name: key=base+'{PATCH twin}'
                tot[key]+=v
    return tot
a=scrape(); t0=time.time(); time.sleep(20); b=scrape(); dt=time.time()-t0
p.wait()
ups=(b['twinhub_http_request_duration_seconds_count{PATCH twin}']-a['twinhub_http_request_duration_seconds_count{PATCH twin}'])
out=[f'{label}: {round(ups/dt)} PATCH /twins/{{id}} per second over {dt:.0f} s of the window (all nodes)']
for k in ['twinhub_raft_batch_commands_count','twinhub_raft_entries_sent_total','twinhub_raft_appends_sent_total','twinhub_rpc_append_batched_total','twinhub_rpc_write_batched_total','twinhub_route_forwarded_total','twinhub_rpc_requests_total','twinhub_storage_fsync_seconds_count','twinhub_storage_fsync_seconds_sum','twinhub_snapshot_encode_seconds_count','twinhub_snapshot_encode_seconds_sum','twinhub_snapshot_bytes_total']:
    d=b[k]-a[k]
    out.append(f'  {k:45s} {d/ups:7.3f} per update {d/dt:8.0f}/s')
out.append(f"  mean snapshot encode ms {1000*(b['twinhub_snapshot_encode_seconds_sum']-a['twinhub_snapshot_encode_seconds_sum'])/max(1,b['twinhub_snapshot_encode_seconds_count']-a['twinhub_snapshot_encode_seconds_count']):.2f}")
out.append(f"  mean fsync ms {1000*(b['twinhub_storage_fsync_seconds_sum']-a['twinhub_storage_fsync_seconds_sum'])/max(1,b['twinhub_storage_fsync_seconds_count']-a['twinhub_storage_fsync_seconds_count']):.3f}")
out.append('  compare row: '+''.join(l for l in open(f'{w}/c.txt') if l.startswith('twinhub')).strip())
open(f'{w}/counts.txt','w').write('\n'.join(out)+'\n'); print('\n'.join(out))
