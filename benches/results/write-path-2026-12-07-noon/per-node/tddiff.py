import gzip,sys,collections
GLUE=('core::','alloc::','<core','<alloc','std::','<std','tokio::','<tokio','futures','<futures','<F as','<T as','<&','<Pin','<S as','[unknown]','__GI','start_thread','clone3','_start','main','__libc','<tracing::instrument')
def load(f,cpu,depth):
    tot=0; agg=collections.Counter()
    for line in gzip.open(f,'rt'):
        st,n=line.rstrip().rsplit(' ',1); n=int(n); tot+=n
        fr=st.split(';'); rest=[x for x in fr[1:] if not x.startswith(GLUE)]
        agg[fr[0][:15]+' | '+' > '.join(x[:60] for x in rest[:depth])]+=n
    return {k:v*cpu/tot for k,v in agg.items()}
d=int(sys.argv[5])
A=load(sys.argv[1],float(sys.argv[2]),d); B=load(sys.argv[3],float(sys.argv[4]),d)
ks=sorted(set(A)|set(B),key=lambda k:-(B.get(k,0)-A.get(k,0)))
print('%6.1f %6.1f'%(sum(A.values()),sum(B.values())))
for k in ks[:int(sys.argv[6])]: print('%6.2f %6.2f %+6.2f %s'%(A.get(k,0),B.get(k,0),B.get(k,0)-A.get(k,0),k))
