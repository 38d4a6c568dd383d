import re,sys
# sums calls= to mimalloc's aligned malloc/zalloc/realloc entry points in a callgrind output file
names={}; total=0; cur=None
want=re.compile(r'^(mi_malloc_aligned|mi_zalloc_aligned|mi_realloc_aligned)$')
for line in open(sys.argv[1]):
    m=re.match(r'^cfn=\((\d+)\)(?: (.*))?',line)
    if m:
        if m.group(2): names[m.group(1)]=m.group(2).strip()
        cur=names.get(m.group(1)); continue
    m=re.match(r'^fn=\((\d+)\)(?: (.*))?',line)
    if m:
        if m.group(2): names[m.group(1)]=m.group(2).strip()
        cur=None; continue
    m=re.match(r'^calls=(\d+)',line)
    if m and cur and want.match(cur.split(' ')[0]) : total+=int(m.group(1))
print(total)
