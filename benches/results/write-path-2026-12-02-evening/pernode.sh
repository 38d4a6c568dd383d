#!/bin/bash
# pernode.sh SC: a twinhub-only compare at SC shards; each node process's CPU over 15 s of the window (BD: the directory of the release build)
SC=$1
${BD:-target/release}/twinhub bench compare --systems twinhub --shard-count $SC --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out /tmp/pn$SC.json > /tmp/pn$SC.txt 2> /tmp/pn$SC.log &
B=$!
until grep -q "closed loop" /tmp/pn$SC.log 2>/dev/null; do sleep 1; done
sleep 10
for p in $(pgrep -f "${BD:-target/release}/twinhub serve"); do echo "$p $(awk '{print $14+$15}' /proc/$p/stat) $(tr '\0' ' ' < /proc/$p/cmdline | grep -o 'node-[0-9]')"; done > /tmp/pn$SC.a
sleep 15
for p in $(pgrep -f "${BD:-target/release}/twinhub serve"); do echo "$p $(awk '{print $14+$15}' /proc/$p/stat)"; done > /tmp/pn$SC.b
wait $B
grep "^twinhub " /tmp/pn$SC.txt
join /tmp/pn$SC.a /tmp/pn$SC.b | awk '{printf "%s cpu %.2f cores\n", $3, ($4-$2)/100/15}'
