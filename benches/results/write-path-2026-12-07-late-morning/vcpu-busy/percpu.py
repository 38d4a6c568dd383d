#!/usr/bin/env python3
# percpu.py OUT: every second, how busy each vCPU was (100 % minus idle and iowait, from /proc/stat).
import time,sys
out=open(sys.argv[1],"w")
def rd():
    r={}
    for l in open("/proc/stat"):
        if l.startswith("cpu") and l[3].isdigit():
            p=l.split(); v=list(map(int,p[1:])); r[p[0]]=(v[3]+v[4], sum(v[:8]), v[7])
    return r
prev=rd()
while True:
    time.sleep(1); cur=rd()
    parts=[]
    for c in sorted(cur):
        di=cur[c][0]-prev[c][0]; dt=cur[c][1]-prev[c][1]; ds=cur[c][2]-prev[c][2]
        parts.append(f"{c}=busy{100-100*di/max(dt,1):.0f}%")
    out.write(time.strftime("%H:%M:%S ")+" ".join(parts)+"\n"); out.flush(); prev=cur
