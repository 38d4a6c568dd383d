import gzip,collections,sys
F=sys.argv[1]; CPU=float(sys.argv[2])
tot=0; rows=[]
for line in gzip.open(F,'rt'):
    st,n=line.rstrip().rsplit(' ',1); n=int(n); tot+=n; rows.append((st.split(';'),n))
G=('core::','alloc::','<core','<alloc','std::','<std','tokio::','<tokio','futures','<futures','<F as','<T as','<&','<Pin','<S as')
for key in sys.argv[3:]:
    depth=3
    agg=collections.Counter(); s=0
    for fr,n in rows:
        at=[k for k,x in enumerate(fr) if key in x]
        if not at: continue
        s+=n
        sub=[x for x in fr[at[-1]+1:] if not x.startswith(G)]
        agg[' > '.join(x[:70] for x in sub[:depth])]+=n
    print(f'### {key}: {s*CPU/tot:.2f} us/update')
    for k,v in agg.most_common(18): print(f'{v*CPU/tot:6.2f} {k}')
