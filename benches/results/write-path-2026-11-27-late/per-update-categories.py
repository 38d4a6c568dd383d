import sys,re,collections
# (transport_frames, added 2026-11-29 for the framed transport, also takes transport::peers, which the
# earlier rows counted under other categories)
# cmpcat.py A.folded rateA cpuA_ms B.folded rateB cpuB_ms : exclusive categories in µs of CPU per update
cats=[('apply','ShardState::apply'),('sm_other','state_machine::StateMachine'),
('group_commit','raft-group-comm'),('fjall_bg','fjall:worker|fjall::worker'),
('front_http','twinhub::http::'),('log_store','storage::log_store|log_cache'),
('transport_server','transport::server'),('transport_client','transport::batch|transport::Transport|shard::network'),
('openraft_core','openraft::core'),('openraft_repl','openraft::replication'),('openraft_other','openraft'),
('transport_frames','transport::frame|transport::listen|transport::peers'),('h2_conn','h2::proto::connection'),('h2_other','h2::|hyper::'),('tokio_sched','tokio::runtime'),]
cats=[(n,re.compile(p)) for n,p in cats]
def load(f):
    agg=collections.Counter(); tot=0
    for line in open(f):
        stack,_,n=line.rstrip().rpartition(' '); n=int(n); tot+=n
        for name,p in cats:
            if p.search(stack): agg[name]+=n; break
        else: agg['other']+=n
    return agg,tot
a,ta=load(sys.argv[1]); b,tb=load(sys.argv[4])
ua=float(sys.argv[3])*1000; ub=float(sys.argv[6])*1000
print(f"{'category':18s} {'A µs/u':>8s} {'B µs/u':>8s} {'B-A':>7s}")
for k in sorted(set(a)|set(b), key=lambda k:-(b[k]/tb*ub-a[k]/ta*ua)):
    x=a[k]/ta*ua; y=b[k]/tb*ub
    print(f"{k:18s} {x:8.1f} {y:8.1f} {y-x:7.1f}")
print(f"{'total':18s} {ua:8.1f} {ub:8.1f} {ub-ua:7.1f}")
