import ctypes,os,sys,time,struct
# slice.py NS [PATTERN]: every second, set the EEVDF slice (sched_runtime) of every thread of processes named twinhub
ns=int(sys.argv[1]); name=sys.argv[2] if len(sys.argv)>2 else 'twinhub'
libc=ctypes.CDLL(None,use_errno=True)
done=set(); errs=0
while True:
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            if open(f'/proc/{p}/comm').read().strip()!=name: continue
            tids=os.listdir(f'/proc/{p}/task')
        except Exception: continue
        for t in tids:
            if (p,t) in done: continue
            try:
                st=open(f'/proc/{p}/task/{t}/stat').read(); nice=int(st.rsplit(')',1)[1].split()[16])
            except Exception: continue
            attr=struct.pack('IIqiIQQQII',56,0,0,nice,0,ns,0,0,0,0)
            buf=ctypes.create_string_buffer(attr)
            r=libc.syscall(314,int(t),buf,0)
            if r!=0: errs+=1
            done.add((p,t))
    sys.stderr.write(f'\rset {len(done)} errs {errs}'); time.sleep(1)
