import gzip,collections,sys
f,cpu,root=sys.argv[1],float(sys.argv[2]),sys.argv[3]
depth=int(sys.argv[4]) if len(sys.argv)>4 else 1
tot=0;inc=collections.Counter();rootn=0
for line in gzip.open(f,'rt'):
    st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
    fr=st.split(';')
    idx=[i for i,x in enumerate(fr) if root in x]
    if not idx: continue
    i=idx[0];rootn+=n
    seen=set()
    for j in range(i+1,min(len(fr),i+1+depth)):
        k=(j-i,fr[j][:110])
        if k in seen: continue
        seen.add(k);inc[k]+=n
    if i==len(fr)-1: inc[(1,'<self>')]+=n
print("root %.2f us"%(rootn*cpu/tot))
for (d,k),v in sorted(inc.items(),key=lambda x:-x[1])[:60]:
    print("%6.2f %d %s"%(v*cpu/tot,d,k))
