# What one append-and-sync costs by how the file was prepared: sparse (set_len, as fjall's journal),
# filled with zeros, fallocate'd, or growing by appends. Run in the data directory's file system:
#   python3 fsync-cost.py [DIR]   (default /tmp/fsync-cost)
# The "zero" rows' KB/sync include the write-back of the 64 MiB of zeros written before the loop.
import os, time, resource, sys
DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp/fsync-cost"
os.makedirs(DIR, exist_ok=True)
def run(mode, sync, n=3000, rec=1300):
    p=f"{DIR}/j-{mode}"
    if os.path.exists(p): os.remove(p)
    fd=os.open(p, os.O_CREAT|os.O_WRONLY)
    if mode=="sparse": os.ftruncate(fd, 64<<20)
    elif mode=="zero":
        z=b"\0"*(1<<20)
        for _ in range(64): os.write(fd,z)
        os.lseek(fd,0,0)
    elif mode=="falloc": os.posix_fallocate(fd,0,64<<20)
    os.fsync(fd)
    r0=resource.getrusage(resource.RUSAGE_SELF); t0=time.time()
    io0=int([l for l in open('/proc/self/io') if l.startswith('write_bytes')][0].split()[1])
    buf=b"x"*rec
    for i in range(n):
        os.write(fd,buf); sync(fd)
    t1=time.time(); r1=resource.getrusage(resource.RUSAGE_SELF)
    io1=int([l for l in open('/proc/self/io') if l.startswith('write_bytes')][0].split()[1])
    cpu=(r1.ru_utime+r1.ru_stime-r0.ru_utime-r0.ru_stime)
    print(f"{mode:7s} {sync.__name__:10s} {1e3*(t1-t0)/n:.3f} ms/sync  cpu {1e6*cpu/n:.1f} us/sync  {(io1-io0)/n/1024:.1f} KB/sync")
    os.close(fd)
for rep in range(2):
  for mode in ["sparse","zero","falloc","append"]:
    for s in [os.fsync, os.fdatasync]:
        run(mode,s)
