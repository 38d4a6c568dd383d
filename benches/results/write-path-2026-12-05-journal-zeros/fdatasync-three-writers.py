# fdatasync-three-writers.py MODE N churn: three processes each doing N x (8 KiB pwrite + fdatasync) into their own 64 MiB file (sparse or zero-filled) while a fourth writes, fsyncs and deletes 2 MiB files every 50 ms
import os,time,sys,multiprocessing as mp
def writer(mode,n,idx,q):
    path='/work/fstest%d.dat'%idx
    if os.path.exists(path): os.unlink(path)
    fd=os.open(path,os.O_RDWR|os.O_CREAT,0o600)
    size=64<<20
    if mode=='sparse': os.ftruncate(fd,size)
    else:
        z=b'\0'*(1<<20)
        for i in range(64): os.write(fd,z)
    os.fsync(fd)
    buf=b'x'*8192; lat=[]
    for i in range(n):
        s=time.perf_counter(); os.pwrite(fd,buf,i*8192); os.fdatasync(fd); lat.append(time.perf_counter()-s)
    os.unlink(path); q.put(lat)
def churn(stop):
    i=0
    while not stop.is_set():
        p='/work/churn%d.sst'%(i%4); fd=os.open(p,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o600)
        os.write(fd,os.urandom(2<<20)); os.fsync(fd); os.close(fd)
        if i>=3: os.unlink('/work/churn%d.sst'%((i-3)%4))
        i+=1; time.sleep(0.05)
mode=sys.argv[1]; n=int(sys.argv[2]); ch=sys.argv[3]=='churn'
q=mp.Queue(); stop=mp.Event()
c=mp.Process(target=churn,args=(stop,)) if ch else None
if c: c.start()
ps=[mp.Process(target=writer,args=(mode,n,i,q)) for i in range(3)]
[p.start() for p in ps]
lat=[]
for p in ps: lat+=q.get()
[p.join() for p in ps]
stop.set(); 
if c: c.join()
for f in os.listdir('/work'):
    if f.startswith('churn'): os.unlink('/work/'+f)
lat.sort(); N=len(lat)
print(mode,ch,'p50 %.3f p99 %.3f p99.9 %.2f max %.2f ms; over 10ms: %d'%(lat[N//2]*1e3,lat[int(N*.99)]*1e3,lat[int(N*.999)]*1e3,lat[-1]*1e3,sum(1 for x in lat if x>0.01)))
