# burst.py MODE SECONDS: a 4 KiB pwrite+fdatasync loop (as a Raft log) while another process writes a 16 MiB
# file every 2 s, MODE: none (no burst) | lump (buffered write, then fsync) | trickle (sync_file_range WRITE every
# 1 MiB) | strict (WRITE of the new MiB and WAIT for the one before)
import os, sys, time, ctypes, multiprocessing
mode, secs = sys.argv[1], float(sys.argv[2])
D = os.environ.get('DIR', '/tmp/tl')
libc = ctypes.CDLL('libc.so.6', use_errno=True)
W, WAIT_BEFORE, WAIT_AFTER = 2, 1, 4
def srange(fd, off, n, flags):
    libc.sync_file_range(ctypes.c_int(fd), ctypes.c_longlong(off), ctypes.c_longlong(n), ctypes.c_uint(flags))
def burster():
    if mode in ('idle', 'be7'):
        prio = (3 << 13) if mode == 'idle' else ((2 << 13) | 7)
        assert libc.syscall(251, 1, 0, prio) == 0
    buf = os.urandom(1 << 20)
    end = time.time() + secs
    while time.time() < end:
        time.sleep(2)
        fd = os.open(f'{D}/burst.dat', os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        for i in range(16):
            os.write(fd, buf)
            if mode == 'trickle':
                srange(fd, i << 20, 1 << 20, W)
            elif mode == 'strict':
                if i > 0:
                    srange(fd, (i - 1) << 20, 1 << 20, WAIT_BEFORE | W | WAIT_AFTER)
                srange(fd, i << 20, 1 << 20, W)
        os.fsync(fd); os.close(fd); os.unlink(f'{D}/burst.dat')
if mode != 'none':
    p = multiprocessing.Process(target=burster); p.start()
fd = os.open(f'{D}/log.dat', os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
os.write(fd, b'\0' * (64 << 20)); os.fsync(fd)
lat = []; off = 0; blk = os.urandom(4096); end = time.time() + secs
while time.time() < end:
    t = time.perf_counter(); os.pwrite(fd, blk, off); os.fdatasync(fd); lat.append(time.perf_counter() - t)
    off = (off + 4096) % (64 << 20)
lat.sort(); n = len(lat)
print(mode, 'n', n, 'p50 %.0f p99 %.0f p99.9 %.0f max %.0f us' % tuple(lat[int(n * q)] * 1e6 for q in (0.5, 0.99, 0.999)) + ('',) if False else mode, n, ['%.0f' % (lat[min(n - 1, int(n * q))] * 1e6) for q in (0.5, 0.99, 0.999, 1.0)], 'over 5ms', sum(1 for x in lat if x > 0.005))
if mode != 'none':
    p.join()
os.unlink(f'{D}/log.dat')
