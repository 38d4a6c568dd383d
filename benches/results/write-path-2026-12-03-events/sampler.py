# every second: per node fsync count/sum and count of fsyncs > 50 ms; write count>50ms; vmstat-ish cpu; psi
import json,ssl,urllib.request,time,sys
c=json.load(open('/tmp/stall/cluster.json'))
ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE
def scrape(a):
    d={}
    for line in urllib.request.urlopen(f'https://{a}/metrics',context=ctx,timeout=2).read().decode().splitlines():
        if line.startswith('twinhub_storage_fsync_seconds') or line.startswith('twinhub_storage_write_seconds') or line.startswith('twinhub_raft_leader_changes') or 'elections' in line:
            k,v=line.rsplit(' ',1); d[k]=float(v)
    return d
def cpu():
    f=open('/proc/stat').readline().split()[1:]; return [int(x) for x in f]
prev=None; pc=cpu()
while True:
    t=time.strftime('%H:%M:%S')
    cur=[scrape(n['http']) for n in c['nodes']]
    cc=cpu(); dc=[a-b for a,b in zip(cc,pc)]; pc=cc; tot=sum(dc) or 1
    psi=open('/proc/pressure/io').readline().split()[1]
    out=[t, f"user {100*dc[0]//tot} sys {100*dc[2]//tot} idle {100*dc[3]//tot} iow {100*dc[4]//tot} steal {100*dc[7]//tot}", psi]
    if prev:
        for i,(a,b) in enumerate(zip(prev,cur)):
            def d(k): return a.get(k,0) and b.get(k,0)-a.get(k,0) or b.get(k,0)-a.get(k,0)
            n=d('twinhub_storage_fsync_seconds_count'); s=d('twinhub_storage_fsync_seconds_sum')
            slow=n-d('twinhub_storage_fsync_seconds_bucket{le="0.05"}')
            wslow=d('twinhub_storage_write_seconds_count')-d('twinhub_storage_write_seconds_bucket{le="0.05"}')
            out.append(f"n{i+1} fsync {int(n)} avg {1000*s/max(n,1):.1f}ms >50ms {int(slow)} write>50ms {int(wslow)}")
    print(' | '.join(out), flush=True)
    prev=cur; time.sleep(1)
