# diffprof.py A.folded.gz CPU_US_A B.folded.gz CPU_US_B: two profiles by layer (the layers of ../write-path-2026-12-01-evening/categories.py, openraft split further), in µs of server CPU per update
import gzip,collections,re,sys
CATS = [
    ('fsync', r'do_fsync|__x64_sys_fsync|fsync'),
    ('group-commit writer, other', r'group_commit::Writer'),
    ('state machine apply', r'sm::worker::Worker.*apply|ShardState::apply'),
    ('front door', r'hyper::proto::h1|http::twins::write|axum::'),
    ('transport', r'cluster::transport'),
    ('openraft core', r'openraft::core::raft_core'),
    ('openraft replication', r'openraft::replication'),
    ('openraft sm worker', r'openraft::core::sm'),
    ('log store', r'storage::log_store'),
    ('change feed and broker', r'notify::|rumqttd|broker'),
    ('tokio scheduler', r'tokio::runtime::scheduler|park|epoll_wait'),
    ('fjall', r'fjall|lsm_tree'),
]
def load(f, cpu):
    tot=0; acc=collections.Counter()
    for line in gzip.open(f,'rt'):
        stack,n=line.rsplit(' ',1); n=int(n); tot+=n
        fr=stack.split(';')[1:]
        for name,rx in CATS:
            if any(re.search(rx,x) for x in fr): acc[name]+=n; break
        else: acc['other']+=n
    return {k: cpu*v/tot for k,v in acc.items()}, tot
a,ta=load(sys.argv[1], float(sys.argv[2])); b,tb=load(sys.argv[3], float(sys.argv[4]))
print(ta,tb)
for k in sorted(set(a)|set(b), key=lambda k:-a.get(k,0)):
    print(f'{k:30s} {a.get(k,0):7.1f} {b.get(k,0):7.1f} {a.get(k,0)-b.get(k,0):7.1f}')
print('total', sum(a.values()), sum(b.values()))
