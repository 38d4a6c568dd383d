import sys
rows=[]
for l in open(sys.argv[1]):
    parts=[p.strip() for p in l.split('|')]
    t=float(parts[0]); nodes=[list(map(float,p.split())) for p in parts[1:4]]
    if any(len(n)<8 for n in nodes): continue
    pr=[float(x.split('=')[1]) for x in parts[4].split()]
    rows.append((t,nodes,pr))
t0=rows[0][0]; prev=None
for t,nodes,pr in rows:
    if prev:
        dt=t-prev[0]
        out=[]
        for a,b in zip(prev[1],nodes):
            out.append('fs%4d >10:%d >50:%d w>10:%d | http%5d >10:%4d >50:%4d'%(b[0]-a[0],b[1]-a[1],b[2]-a[2],b[3]-a[3],b[4]-a[4],b[5]-a[5],b[6]-a[6]))
        print('%5.1f'%(t-t0),' || '.join(out), 'cpu %3.0f%% io %3.0f%%'%((pr[0]-prev[2][0])/dt/1e4,(pr[1]-prev[2][1])/dt/1e4))
    prev=(t,nodes,pr)
