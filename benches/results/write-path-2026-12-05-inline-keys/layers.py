import gzip,collections,sys
f=sys.argv[1]; cpu=float(sys.argv[2])
tot=0
rows=[]
for line in gzip.open(f,'rt'):
    st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
    rows.append((st.split(';'),n))
rules=[
 ('group-commit thread', lambda fr: fr[0].startswith('raft-group')),
 ('fjall/snapshot/broker threads', lambda fr: not fr[0].startswith('tokio-rt')),
 ('notify/change feed/watch', lambda fr: any('twinhub::notify' in x or 'rumqttd' in x for x in fr)),
 ('state machine apply', lambda fr: any('state_machine' in x and 'apply' in x for x in fr) or any('ShardState' in x for x in fr)),
 ('twin actor', lambda fr: any('twinhub::twin::actor' in x for x in fr)),
 ('inter-node transport', lambda fr: any('cluster::transport' in x for x in fr)),
 ('openraft core', lambda fr: any('openraft' in x for x in fr)),
 ('storage (log)', lambda fr: any('twinhub::storage' in x for x in fr)),
 ('front door http', lambda fr: any('hyper' in x or 'axum' in x or 'twinhub::http' in x for x in fr)),
 ('rustls other', lambda fr: any('rustls' in x for x in fr)),
 ('tokio scheduler/park', lambda fr: any('tokio::runtime' in x for x in fr)),
 ('other', lambda fr: True),
]
c=collections.Counter()
for fr,n in rows:
    for name,p in rules:
        if p(fr): c[name]+=n; break
for name,_ in rules: print("%6.2f %s"%(c[name]*cpu/tot,name))
