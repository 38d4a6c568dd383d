# leaf.py KEY: in a folded profile ($F), the samples under frames containing KEY, by innermost frame and by innermost frame of our own code
import gzip,collections,re,sys
key=sys.argv[1]; import os; F=os.environ.get('F',__import__('os').path.join(__import__('os').path.dirname(__file__),'profile.folded.gz'))
c=collections.Counter();d=collections.Counter();tot=0;t=0
for line in gzip.open(F,'rt'):
    st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
    fr=st.split(';')
    ks=[k for k,x in enumerate(fr) if key in x]
    if not ks: continue
    t+=n; i=ks[-1]
    c[fr[-1][:110]]+=n
    ours=[x for x in fr[i+1:] if re.match(r'^<?twinhub',x)]
    d[(ours[-1] if ours else '-')[:130]]+=n
print(f"{100*t/tot:.2f}%")
for k,v in c.most_common(25): print(f"{100*v/tot:5.2f} {k}")
print('--- innermost our fn')
for k,v in d.most_common(30): print(f"{100*v/tot:5.2f} {k}")
