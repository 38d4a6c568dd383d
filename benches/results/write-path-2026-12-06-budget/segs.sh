#!/bin/bash
S=${1:-10}
snap(){ awk '/^Tcp:/{if(h){print $11, $12} h=1}' /proc/net/snmp; awk '/^TcpExt:/{if(h){for(i=1;i<=NF;i++) v[i]=$i} else {for(i=1;i<=NF;i++) n[i]=$i} h=1} END{for(i in n) if(n[i]=="DelayedACKs"||n[i]=="TCPHPAcks"||n[i]=="TCPPureAcks"||n[i]=="TCPHPHits"||n[i]=="TCPBacklogCoalesce") printf "%s=%s ",n[i],v[i]; print ""}' /proc/net/netstat; }
a=$(snap); sleep $S; b=$(snap)
echo "before: $a"; echo "after:  $b"
