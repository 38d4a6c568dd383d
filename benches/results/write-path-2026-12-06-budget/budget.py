import gzip,collections,sys,re
# budget.py FOLDED CPU_US: a folded profile of the nodes (profile-run.sh) split by where each sample is spent: the kernel by system call, else the crate of the innermost frame that names one (std and core frames are charged to their caller), as a Markdown table in µs per update (CPU_US: the run's server µs per update).
f,cpu=sys.argv[1],float(sys.argv[2])
groups={'kernel: socket writes (loopback TCP, incl. the receiver side)':['do_writev','__x64_sys_sendto'],
'kernel: fdatasync':['__x64_sys_fdatasync'],'kernel: futex waits and wakes':['__x64_sys_futex'],'kernel: epoll_wait':['__x64_sys_epoll_wait'],
'kernel: file writes (journal, eventfd)':['ksys_write','__x64_sys_pwrite64'],'kernel: socket reads':['__x64_sys_recvfrom'],}
cr={'allocator (mimalloc)':['mimalloc'],'our code (twinhub, twinhub_core)':['twinhub','twinhub_core'],
'async runtime and actors (tokio, futures, ractor, mio, parking_lot)':['tokio','futures_util','futures_core','ractor','mio','parking_lot','parking_lot_core','crossbeam_channel'],
'HTTP (hyper, axum, http, tower, matchit, httparse)':['hyper','hyper_util','axum','axum_core','http','http_body_util','tower','matchit','httparse','h2'],
'TLS and signatures (rustls, ring, sha2, hmac, base64)':['rustls','ring','sha2','hmac','base64','tokio_rustls'],
'JSON (serde_json, serde)':['serde_json','serde','serde_core'],'Raft (openraft)':['openraft','openraft_rt','openraft_multi'],
'storage (fjall, lsm_tree, lz4_flex, crossbeam_epoch, byteview)':['fjall','lsm_tree','lz4_flex','crossbeam_epoch','crossbeam_skiplist','byteview'],
'maps and buffers (imbl, archery, hashbrown, indexmap, smol_str, bytes)':['imbl','imbl_sized_chunks','archery','hashbrown','indexmap','smol_str','bytes'],
'event broker (rumqttd), postcard, metrics, tracing':['rumqttd','postcard','metrics','metrics_util','tracing','tracing_core','tracing_subscriber']}
gen=('core::','alloc::','std::','<core::','<alloc::','<std::','__rust','<&','<T as','<F as','<[','<()','<u','<i','<str','<&mut')
def crate(x):
    m=re.match(r'^<?([a-z_][a-z0-9_]*)::',x); return m.group(1) if m else None
tot=0;c=collections.Counter()
for line in gzip.open(f,'rt'):
    st,n=line.rstrip().rsplit(' ',1);n=int(n);tot+=n
    fr=st.split(';'); lab=None
    if any(x.startswith('entry_SYSCALL') or x.startswith('asm_') for x in fr):
        lab='kernel: other (interrupts, page faults, scheduling)'
        for g,ks in groups.items():
            if any(x in ks for x in fr): lab=g;break
    else:
        for x in reversed(fr):
            if x.startswith('mi_') or x.startswith('_mi_'): lab='allocator (mimalloc)';break
            if x.startswith('__mem') or x.startswith('hashbrown::') and False: continue
            if any(x.startswith(g) for g in gen): continue
            k=crate(x)
            if k:
                lab=next((g for g,ks in cr.items() if k in ks),'other libraries'); break
        if lab is None:
            lab='kernel: scheduler (context switch return)' if fr[-1].startswith('finish_task_switch') else 'unresolved (libc memcpy, std)'
    c[lab]+=n
print("| where | µs per update | share |\n| --- | ---: | ---: |")
for k,v in c.most_common(): print("| %s | %.1f | %.1f %% |"%(k,v*cpu/tot,100*v/tot))
