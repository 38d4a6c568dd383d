# perf script of sched:sched_switch (with stacks) -> off-CPU time of tokio-rt-worker threads by blocking stack and state
import sys,re,collections
ev=[]; cur=None
for line in sys.stdin:
    if not line.strip():
        if cur: ev.append(cur); cur=None
        continue
    if not line.startswith((' ','\t')):
        m=re.search(r'^\s*(\S.*?)\s+(\d+)(?:/\d+)?\s+\[\d+\]\s+([\d.]+):\s+sched:sched_switch:\s+(.*)$', line)
        if m:
            comm,tid,ts,rest=m.groups()
            a=dict(re.findall(r'(\w+)=(\S+)',rest))
            cur={'comm':comm,'tid':int(tid),'ts':float(ts),'a':a,'stack':[]}
        continue
    if cur is not None:
        parts=line.strip().split(None,1)
        if len(parts)==2: cur['stack'].append(re.sub(r'\+0x[0-9a-f]+.*$','',parts[1]).strip())
if cur: ev.append(cur)
out={}
acc=collections.Counter(); cnt=collections.Counter(); long=collections.Counter()
for e in ev:
    a=e['a']
    prev=int(a.get('prev_pid',-1)); nxt=int(a.get('next_pid',-1))
    if e['comm'].startswith('tokio-rt-worker') and prev==e['tid']:
        out[prev]=(e['ts'],a.get('prev_state','?'),e['stack'])
    if nxt in out:
        t0,st,stack=out.pop(nxt)
        d=e['ts']-t0
        user=[f for f in stack if not re.match(r'^(\[|__|schedule|finish_task|entry_SYSCALL|do_syscall|x64_sys|ksys_|vfs_|do_|syscall|futex|std::|core::|<std|<core|alloc::|<alloc|\[unknown\])',f)]
        key=st+' | '+' <- '.join(user[:4])[:300]
        acc[key]+=d; cnt[key]+=1
        if d>0.02: long[key]+=1
tot=sum(acc.values())
print(f'off-CPU total of runtime workers: {tot:.2f} s')
for k,v in acc.most_common(25): print(f'{v:8.3f}s {cnt[k]:6d} sw {long[k]:4d} >20ms  {k}')
