import sys,gzip,collections,re
pat=re.compile(sys.argv[5]); excl=re.compile(sys.argv[6]) if len(sys.argv)>6 and sys.argv[6] else None
def load(f,cpu):
    tot=0;inc=collections.Counter()
    for line in gzip.open(f,'rt'):
        st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
        if excl and excl.search(st): continue
        fr=st.split(';')
        idx=next((i for i,x in enumerate(fr) if pat.search(x)),None)
        if idx is None: continue
        for g in set(x[:100] for x in fr[idx:]): inc[g]+=n
    s=cpu/tot
    return {k:v*s for k,v in inc.items()}
A=load(sys.argv[1],float(sys.argv[2])); B=load(sys.argv[3],float(sys.argv[4]))
d=sorted(set(A)|set(B),key=lambda k:-(B.get(k,0)-A.get(k,0)))
for k in d[:60]: print('%6.2f %6.2f %+6.2f %s'%(A.get(k,0),B.get(k,0),B.get(k,0)-A.get(k,0),k))
