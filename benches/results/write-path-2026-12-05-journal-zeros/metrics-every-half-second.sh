#!/bin/bash
# metrics-every-half-second.sh CLUSTER_JSON OUT SECONDS: about every 0.5 s, per node: fsync/write/http histogram counts over 10/50 ms, apply index; cpu/io pressure
C=$1; O=$2; N=$(( $3 * 2 ))
PORTS=$(grep -o '"http": "127.0.0.1:[0-9]*' $C | cut -d: -f3)
for i in $(seq $N); do
  line="$(date +%s.%N)"
  for p in $PORTS; do
    m=$(curl -sk --max-time 1 https://127.0.0.1:$p/metrics)
    line="$line | $(echo "$m" | awk '
      /^twinhub_storage_fsync_seconds_count/ {fc=$2}
      /^twinhub_storage_fsync_seconds_bucket\{le="0.01"\}/ {f10=$2}
      /^twinhub_storage_fsync_seconds_bucket\{le="0.05"\}/ {f50=$2}
      /^twinhub_storage_write_seconds_count/ {wc=$2}
      /^twinhub_storage_write_seconds_bucket\{le="0.01"\}/ {w10=$2}
      /^twinhub_http_request_duration_seconds_count/ && /PATCH/ {hc=$2}
      /^twinhub_http_request_duration_seconds_bucket/ && /PATCH/ && /le="0.05"/ {h50=$2}
      /^twinhub_http_request_duration_seconds_bucket/ && /PATCH/ && /le="0.01"/ {h10=$2}
      /^twinhub_shard_apply_index/ {ai=$2}
      END {print fc, fc-f10, fc-f50, wc-w10, hc, hc-h10, hc-h50, ai}')"
  done
  line="$line | $(grep some /proc/pressure/cpu | cut -d' ' -f5) $(grep some /proc/pressure/io | cut -d' ' -f5)"
  echo "$line"
  sleep 0.45
done > $O
