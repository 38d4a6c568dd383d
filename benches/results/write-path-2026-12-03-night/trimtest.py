# trimtest.py DIR MODE: a small-write fdatasync loop (like a log's group commit) while another thread
# writes and fsyncs a 6.6 MB file every second, then deletes it (MODE=delete) or rewrites it in place (MODE=reuse).
import os, sys, time, threading
d, mode = sys.argv[1], sys.argv[2]
os.makedirs(d, exist_ok=True)
stop = False
blob = os.urandom(6_600_000)
def snapshots():
    i = 0
    reuse = os.path.join(d, 'slot')
    while not stop:
        if mode == 'delete':
            p = os.path.join(d, f'snap-{i}')
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, blob); os.fsync(fd); os.close(fd)
            if i > 0: os.unlink(os.path.join(d, f'snap-{i-1}'))
        else:
            fd = os.open(reuse, os.O_WRONLY | os.O_CREAT, 0o600)
            os.pwrite(fd, blob, 0); os.fsync(fd); os.close(fd)
        i += 1
        time.sleep(0.2)
t = threading.Thread(target=snapshots); t.start()
fd = os.open(os.path.join(d, 'log'), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
lat = []
end = time.time() + float(sys.argv[3]) if len(sys.argv) > 3 else time.time() + 30
while time.time() < end:
    os.write(fd, b'x' * 400)
    t0 = time.perf_counter(); os.fdatasync(fd); lat.append(time.perf_counter() - t0)
stop = True; t.join()
lat.sort()
n = len(lat)
print(f'{mode}: {n} fdatasyncs, p50 {lat[n//2]*1e3:.2f} ms, p99 {lat[int(n*0.99)]*1e3:.2f} ms, max {lat[-1]*1e3:.1f} ms, >50ms {sum(x>0.05 for x in lat)}, >100ms {sum(x>0.1 for x in lat)}')
import shutil; shutil.rmtree(d)
