# under.py KEY [DEPTH] [N]: in a folded profile ($F, default the profile here), the samples under the innermost frame containing KEY, by the next DEPTH frames of ours or libraries (generic frames skipped)
import gzip,collections,re,sys
key=sys.argv[1]; import os; F=os.environ.get('F',__import__('os').path.join(__import__('os').path.dirname(__file__),'profile.folded.gz')); depth=int(sys.argv[2]) if len(sys.argv)>2 else 2
c=collections.Counter();tot=0;t=0
for line in gzip.open(F,'rt'):
    st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
    fr=st.split(';')
    ks=[k for k,x in enumerate(fr) if key in x]
    if not ks: continue
    t+=n; i=ks[-1]
    ch=[x for x in fr[i+1:] if not x.startswith(('core::','alloc::','<core','<alloc','std::','<std','tokio::','<tokio','futures','<futures','<F as','<T as','<&','<Pin','<S as'))][:depth]
    c[' > '.join(y[:70] for y in ch)]+=n
print(f"{100*t/tot:.2f}%")
for k,v in c.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 30): print(f"{100*v/tot:5.2f} {k}")
