# threads-snap.py snap PID...: JSON of every thread of the given processes: name, voluntary and involuntary context switches, CPU ticks (utime+stime)
import sys,os,collections
def snap(pids):
    d={}
    for p in pids:
        for t in os.listdir(f'/proc/{p}/task'):
            try:
                comm=open(f'/proc/{p}/task/{t}/comm').read().strip()
                st=open(f'/proc/{p}/task/{t}/status').read()
                v=int(st.split('voluntary_ctxt_switches:')[1].split()[0]); nv=int(st.split('nonvoluntary_ctxt_switches:')[1].split()[0])
                stat=open(f'/proc/{p}/task/{t}/stat').read().rsplit(')',1)[1].split()
                cpu=int(stat[11])+int(stat[12])
                d[(p,t)]=(comm,v,nv,cpu)
            except Exception: pass
    return d
import time,json
pids=sys.argv[2:]; mode=sys.argv[1]
if mode=='snap':
    print(json.dumps({f'{k[0]}/{k[1]}':v for k,v in snap(pids).items()}))
