import sys,gzip,collections
# us per update spent in BTreeMap searches under apply, and in apply's sub-parts
f,cpu=sys.argv[1],float(sys.argv[2])
tot=0;c=collections.Counter()
keys={'btree search (apply)':lambda st:'apply_batch' in st and 'btree::search' in st,
      'apply total':lambda st:'apply_batch' in st,
      'parse_json':lambda st:'validate::parse_json' in st,
      'render_text':lambda st:'render_text' in st and 'apply_batch' in st}
for line in gzip.open(f,'rt'):
    st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
    for k,fn in keys.items():
        if fn(st): c[k]+=n
for k in keys: print('%-24s %6.2f us'%(k,c[k]*cpu/tot))
