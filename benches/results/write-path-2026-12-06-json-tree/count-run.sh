#!/bin/bash
# count-run.sh BUILD_DIR OUT LABEL: a twinhub-only compare of BUILD_DIR's twinhub (its twinhub-bench as
# the load generator); 10 s into the measured window, `perf stat` counts the instructions and cycles
# of the 3 nodes (user and kernel apart) for 10 s while the nodes' own counter of answered PATCHes
# (`twinhub_http_requests_total`, status 200, summed over the nodes) is read before and after.
# Prints one line: LABEL, updates in the window, then instructions and cycles per update (user,
# kernel). Instructions per update barely move with the machine's speed, which time per update does.
BD=$1; O=$2; L=$3; mkdir -p "$O"
"$BD/twinhub-bench" compare --bin "$BD/twinhub" --systems twinhub --duration 30 --concurrency 64 --twins 10000 \
  --value-bytes 200 --out "$O/$L.json" > "$O/$L.txt" 2> "$O/$L.err" &
B=$!
until grep -q "closed loop" "$O/$L.err" 2>/dev/null; do kill -0 $B 2>/dev/null || { tail "$O/$L.err"; exit 1; }; sleep 1; done
sleep 10
PIDS=$(pgrep -f "$BD/twinhub serve" | paste -sd, -)
ports() { for c in $(pgrep -af "$BD/twinhub serve" | grep -o 'config [^ ]*' | cut -d' ' -f2); do
  grep -o 'http_listen = "[^"]*"' "$c" | cut -d'"' -f2; done; }
patches() { local n=0; for p in $(ports); do
  v=$(curl -sk "https://$p/metrics" | grep '^twinhub_http_requests_total{method="PATCH",route="/twins/{id}",status="200"}' | awk '{print $2}')
  n=$((n + ${v:-0})); done; echo $n; }
u0=$(patches)
perf stat -x, -e instructions:u,instructions:k,cycles:u,cycles:k -p "$PIDS" -o "$O/$L.stat" -- sleep 10 > /dev/null 2>&1
u1=$(patches)
wait $B
python3 - "$O/$L.stat" "$L" $((u1 - u0)) <<'PY'
import sys
stat, label, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = {}
for line in open(stat):
    f = line.strip().split(',')
    if len(f) > 2 and f[0].replace('.', '').isdigit():
        c[f[2]] = float(f[0])
per = lambda k: c.get(k, 0) / max(n, 1)
print(f"{label} updates {n} instr/u user {per('instructions:u'):.0f} kernel {per('instructions:k'):.0f} "
      f"cycles/u user {per('cycles:u'):.0f} kernel {per('cycles:k'):.0f}")
PY
