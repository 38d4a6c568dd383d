import os, sys, time, resource, mmap
# syncbench.py [N] [BYTES] [FILE]: CPU and wall time per durable append of BYTES to a file preallocated with zeros
# (so no sync allocates blocks), N times each way: write+fdatasync, O_DSYNC writes, O_DIRECT|O_DSYNC writes, writes alone.
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
SZ = int(sys.argv[2]) if len(sys.argv) > 2 else 9000
path = sys.argv[3] if len(sys.argv) > 3 else "/tmp/syncbench-journal.bin"
total = (N + 10) * 16384
def prealloc():
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    z = b"\0" * (1 << 20)
    for _ in range(total // len(z) + 1):
        os.write(fd, z)
    os.fsync(fd); os.close(fd)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
def run(name, flags, sync, direct=False):
    prealloc()
    fd = os.open(path, os.O_WRONLY | flags)
    if direct:
        blk = ((SZ + 4095) // 4096) * 4096
        buf = mmap.mmap(-1, blk); buf.write(b"x" * blk)
    else:
        buf = b"x" * SZ
    off = 0
    c0, t0 = cpu(), time.perf_counter()
    for i in range(N):
        os.pwrite(fd, buf, off)
        if sync: os.fdatasync(fd)
        off += len(buf)
    c1, t1 = cpu(), time.perf_counter()
    os.close(fd)
    print(f"{name:28s} wall {1e6*(t1-t0)/N:8.1f} us/op  cpu {1e6*(c1-c0)/N:7.1f} us/op")
run("pwrite+fdatasync", 0, True)
run("pwrite O_DSYNC", os.O_DSYNC, False)
run("pwrite O_DIRECT|O_DSYNC", os.O_DSYNC | os.O_DIRECT, False, direct=True)
run("pwrite only (no sync)", 0, False)
