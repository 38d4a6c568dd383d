#!/bin/bash
# sysamp.sh SECONDS: CPU split from /proc/stat and disk ops from /proc/diskstats over SECONDS
S=${1:-10}
read -r _ u n s i w irq sirq st _ < /proc/stat
d1=$(awk '$3=="vda"{print $4, $8, $13, $19, $20}' /proc/diskstats)
sleep $S
read -r _ u2 n2 s2 i2 w2 irq2 sirq2 st2 _ < /proc/stat
d2=$(awk '$3=="vda"{print $4, $8, $13, $19, $20}' /proc/diskstats)
tot=$(( (u2-u)+(n2-n)+(s2-s)+(i2-i)+(w2-w)+(irq2-irq)+(sirq2-sirq)+(st2-st) ))
echo "user $(( 100*(u2-u+n2-n)/tot ))% sys $(( 100*(s2-s)/tot ))% idle $(( 100*(i2-i)/tot ))% iowait $(( 100*(w2-w)/tot ))% irq+soft $(( 100*(irq2-irq+sirq2-sirq)/tot ))% steal $(( 100*(st2-st)/tot ))%"
set -- $d1; r1=$1; w1=$2; io1=$3; fl1=$4; fm1=$5
set -- $d2
echo "disk: reads/s $(( ($1-r1)/S )) writes/s $(( ($2-w1)/S )) io-busy-ms/s $(( ($3-io1)/S )) flushes/s $(( ($4-fl1)/S )) flush-ms/s $(( ($5-fm1)/S ))"
