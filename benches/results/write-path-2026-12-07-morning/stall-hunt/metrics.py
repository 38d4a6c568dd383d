#!/usr/bin/env python3
# metrics.py OUT: every second, from each running twinhub node's /metrics: the shard's log, commit, apply and
# snapshot indexes, its largest replica lag, and the means over that second of its fsyncs, its outgoing
# inter-node calls and its HTTP requests (sum/count deltas), and how many of its storage rounds' writes and
# fsyncs that second took over 5, 10 and 25 ms (histogram bucket deltas: slow=n5/n10/n25), one line per node.
import os, sys, time, re, ssl, urllib.request
out = open(sys.argv[1], "w")
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
KEEP = ("twinhub_shard_apply_index", "twinhub_shard_commit_index", "twinhub_shard_last_log_index",
        "twinhub_shard_max_replica_lag", "twinhub_shard_snapshot_index", "twinhub_shard_is_leader",
        "twinhub_shard_leader_changes_total", "twinhub_raft_appends_sent_total", "twinhub_raft_entries_sent_total")
MEANS = ("twinhub_storage_fsync_seconds", "twinhub_rpc_request_duration_seconds", "twinhub_http_request_duration_seconds")
prev = {}
def nodes():
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try: cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError: continue
        if len(cmd) < 2 or os.path.basename(cmd[0]) != b"twinhub" or cmd[1] != b"serve": continue
        args = [c.decode() for c in cmd]
        if "--config" not in args: continue
        conf = args[args.index("--config") + 1]
        try: text = open(conf).read()
        except OSError: continue
        m = re.search(r'http_listen\s*=\s*"[^"]*:(\d+)"', text)
        n = re.search(r'node-(\d+)', conf)
        if m: yield (n.group(1) if n else pid), int(m.group(1))
while True:
    t0 = time.time()
    for node, port in sorted(nodes()):
        try: body = urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=0.5).read().decode()
        except Exception as e:
            out.write(f"{time.strftime('%H:%M:%S')} n{node} error {type(e).__name__}\n"); continue
        vals = {}; sums = {}
        for l in body.splitlines():
            for h in ("twinhub_storage_write_seconds", "twinhub_storage_fsync_seconds"):
                if l.startswith(h + "_bucket{"):
                    le = l.split('le="')[1].split('"')[0]
                    if le in ("0.005", "0.01", "0.025", "+Inf"):
                        sums[f"{h[16:-8]}_le{le}"] = sums.get(f"{h[16:-8]}_le{le}", 0) + float(l.rsplit(" ", 1)[1])
        for l in body.splitlines():
            if l.startswith("#") or not l.strip(): continue
            k, v = l.rsplit(" ", 1)
            base = k.split("{")[0]
            try: v = float(v)
            except ValueError: continue
            if base in KEEP: vals[base[8:]] = vals.get(base[8:], 0) + v
            for mname in MEANS:
                if base == mname + "_sum": sums[mname[8:] + "_s"] = sums.get(mname[8:] + "_s", 0) + v
                if base == mname + "_count": sums[mname[8:] + "_n"] = sums.get(mname[8:] + "_n", 0) + v
        p = prev.get(node, {}); prev[node] = dict(vals, **sums)
        parts = [f"{k}={int(v)}" for k, v in sorted(vals.items())]
        for mname in MEANS:
            s, c = mname[8:] + "_s", mname[8:] + "_n"
            if s in sums and s in p and sums[c] > p[c]:
                parts.append(f"{mname[8:-8]}={sums[c]-p[c]:.0f}/s,{1000*(sums[s]-p[s])/(sums[c]-p[c]):.2f}ms")
        for h in ("write", "fsync"):
            k = f"{h}_le+Inf"
            if k in sums and k in p:
                tot = sums[k] - p[k]
                over = [tot - (sums[f"{h}_le{le}"] - p.get(f"{h}_le{le}", 0)) for le in ("0.005", "0.01", "0.025")]
                parts.append(f"{h}_slow=" + "/".join(f"{o:.0f}" for o in over))
        out.write(f"{time.strftime('%H:%M:%S')} n{node} " + " ".join(parts) + "\n")
    out.flush()
    time.sleep(max(0.05, 1 - (time.time() - t0)))
