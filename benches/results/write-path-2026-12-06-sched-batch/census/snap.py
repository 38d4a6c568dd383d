import os,sys,json,time,collections
def snap():
    out={}
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            cmd=open(f'/proc/{pid}/cmdline','rb').read().split(b'\0')
        except Exception: continue
        exe=os.path.basename(cmd[0].decode(errors='replace')) if cmd and cmd[0] else ''
        if exe not in ('twinhub','twinhub-bench'): continue
        role=exe
        if exe=='twinhub':
            a=[c.decode(errors='replace') for c in cmd]
            role='node:'+next((x for x in a if 'node-' in x or 'node' in x and '/' in x),'?')[-20:]
        for tid in os.listdir(f'/proc/{pid}/task'):
            try:
                st=open(f'/proc/{pid}/task/{tid}/status').read()
                comm=open(f'/proc/{pid}/task/{tid}/comm').read().strip()
                stat=open(f'/proc/{pid}/task/{tid}/stat').read().rsplit(')',1)[1].split()
            except Exception: continue
            v=int([l for l in st.splitlines() if l.startswith('voluntary_ctxt')][0].split()[1])
            nv=int([l for l in st.splitlines() if l.startswith('nonvoluntary_ctxt')][0].split()[1])
            cpu=int(stat[11])+int(stat[12])
            out[f'{pid}/{tid}']=(role if exe=='twinhub-bench' else f'node{pid}',comm,v,nv,cpu)
    return out
a=snap(); t0=time.time(); time.sleep(float(sys.argv[1])); b=snap(); dt=time.time()-t0
agg=collections.defaultdict(lambda:[0,0,0,0])
for k,(role,comm,v,nv,cpu) in b.items():
    if k not in a: continue
    _,_,v0,nv0,c0=a[k]
    import re
    name=re.sub(r'[-_:]?\d+$','',comm)
    # BY=node in the environment: each node apart (keyed by its process id) instead of all nodes together
    key=(('client' if role=='twinhub-bench' else (role if os.environ.get('BY')=='node' else 'node')),name)
    g=agg[key]; g[0]+=v-v0; g[1]+=nv-nv0; g[2]+=cpu-c0; g[3]+=1
tv=sum(g[0] for g in agg.values()); tn=sum(g[1] for g in agg.values())
print(f'window {dt:.1f}s  voluntary {tv/dt:.0f}/s involuntary {tn/dt:.0f}/s')
for k,g in sorted(agg.items(),key=lambda x:-(x[1][0]+x[1][1])):
    if g[0]+g[1]==0 and g[2]==0: continue
    print(f'{k[0]:6} {k[1]:28} threads {g[3]:3} vol/s {g[0]/dt:8.0f} invol/s {g[1]/dt:7.0f} cpu% {g[2]/dt:6.1f}')
