import sys,gzip,collections
def load(f,cpu):
    tot=0;inc=collections.Counter();slf=collections.Counter()
    for line in gzip.open(f,'rt'):
        st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
        fr=st.split(';')
        slf[fr[-1][:90]]+=n
        for g in set(x[:90] for x in fr): inc[g]+=n
    s=cpu/tot
    return {k:v*s for k,v in inc.items()},{k:v*s for k,v in slf.items()}
a_inc,a_slf=load(sys.argv[1],float(sys.argv[2]))
b_inc,b_slf=load(sys.argv[3],float(sys.argv[4]))
for name,A,B in (('self',a_slf,b_slf),('incl',a_inc,b_inc)):
    print('==',name)
    d=sorted(set(A)|set(B),key=lambda k:-(B.get(k,0)-A.get(k,0)))
    for k in d[:int(sys.argv[5]) if len(sys.argv)>5 else 30]: print('%6.2f %6.2f %+6.2f %s'%(A.get(k,0),B.get(k,0),B.get(k,0)-A.get(k,0),k))
