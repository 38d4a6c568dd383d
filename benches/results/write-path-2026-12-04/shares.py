# shares.py PROFILE.folded.gz...: the costs this section changed, as shares of all node samples
import gzip,sys,collections
pats={'front door body check':('http::body::json_and_text','validate_twin_body_text','validate_twin_patch','http::body::text'),
 'drop of the parsed body':('drop_in_place<serde_json::value::Value>;',),
 'JsonText::serialize':('JsonText as serde_core::ser::Serialize>::serialize',),
 'twin::answer (forwarded answer written)':('twinhub::twin::answer',),
 'forwarded answer read':('Twins::forward::{{closure}};serde_json::de::from_slice',),
 'change event to JSON':('ChangeEvent>::to_json',),
 'http::twins::write (all)':('http::twins::write::{{closure}}',),
}
names=[a.split('/')[-1].replace('profile-','').replace('.folded.gz','') for a in sys.argv[1:]]
print('%-42s'%'', *[f'{n:>7s}' for n in names])
res={}
for a in sys.argv[1:]:
    acc=collections.Counter(); tot=0
    for line in gzip.open(a,'rt'):
        s,n=line.rsplit(' ',1); n=int(n); tot+=n
        for k,ps in pats.items():
            if k.startswith('drop'):
                if 'http::twins::write' in s and 'Twins::write' not in s and any(p in s for p in ps): acc[k]+=n
            elif any(p in s for p in ps): acc[k]+=n
    res[a]={k:100*acc[k]/tot for k in pats}; res[a]['samples']=tot
for k in list(pats)+['samples']:
    print('%-42s'%k, *[f'{res[a][k]:7.2f}' for a in sys.argv[1:]])
