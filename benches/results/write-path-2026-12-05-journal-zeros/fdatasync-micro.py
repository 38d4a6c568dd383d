# fdatasync-micro.py MODE N [PATH]: N x (4 KiB pwrite + fdatasync) into a 64 MiB file made sparse (set_len), written with zeros first, or fallocated; per-op time, CPU, percentiles
import os,time,sys
mode=sys.argv[1]; n=int(sys.argv[2]); path=sys.argv[3] if len(sys.argv)>3 else '/work/fstest.dat'
if os.path.exists(path): os.unlink(path)
fd=os.open(path,os.O_RDWR|os.O_CREAT,0o600)
size=64<<20
if mode=='sparse': os.ftruncate(fd,size)
elif mode=='falloc': os.posix_fallocate(fd,0,size)
elif mode=='zero':
    z=b'\0'*(1<<20)
    for i in range(64): os.write(fd,z)
os.fsync(fd)
buf=b'x'*4096
lat=[]
t0=time.perf_counter(); c0=time.process_time()
for i in range(n):
    s=time.perf_counter()
    os.pwrite(fd,buf,i*4096)
    os.fdatasync(fd)
    lat.append(time.perf_counter()-s)
el=time.perf_counter()-t0; cpu=time.process_time()-c0
lat.sort()
print(mode,'n',n,'per op us %.0f'%(el/n*1e6),'cpu us %.0f'%(cpu/n*1e6),'p50 %.3f p99 %.3f max %.2f ms'%(lat[n//2]*1e3,lat[int(n*.99)]*1e3,lat[-1]*1e3))
os.unlink(path)
