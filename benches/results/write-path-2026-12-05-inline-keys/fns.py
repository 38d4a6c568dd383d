import gzip,collections,sys
def load(f,cpu):
    tot=0;rows=[]
    for line in gzip.open(f,'rt'):
        st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
        rows.append((st.split(';'),n))
    inc=collections.Counter()
    for fr,n in rows:
        for g in set(x[:100] for x in fr): inc[g]+=n
    return {k:v*cpu/tot for k,v in inc.items()}
A=load(sys.argv[1],float(sys.argv[2])); B=load(sys.argv[3],float(sys.argv[4]))
for k in sys.argv[5:]:
    for name in sorted(set(A)|set(B)):
        if k in name: print("%6.2f %6.2f %s"%(A.get(name,0),B.get(name,0),name[:100]))
