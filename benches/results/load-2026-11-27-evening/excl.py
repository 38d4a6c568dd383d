import sys, re, collections
# exclusive categorization: first matching category (priority order) per stack
f=sys.argv[1]; twins=float(sys.argv[2]) if len(sys.argv)>2 else 0
cats=[('snapshot','build_snapshot|SnapshotImage|snapshot_files|persist_snapshot|install_snapshot|decode_snapshot'),
('apply','ShardState::apply|storage::state_machine.*apply'),
('bulk_front','http::bulk'),('http_other','twinhub::http::'),
('group_commit','group_commit'),('fjall_bg','fjall::worker_pool|fjall:worker|lsm_tree::compaction|flush'),
('log_store','storage::log_store|log_cache'),
('transport_client','transport::client|transport::batch|RaftNetwork|network::'),('transport_server','transport::server|transport::service'),
('replication','openraft::replication'),('raft_core','openraft::core'),('openraft_other','openraft'),
('twin_actor','twin::'),('shard_calls','shard::'),
('h2','h2::'),('hyper','hyper'),('tls','rustls|tokio_rustls|aws_lc'),
('tokio','tokio::runtime'),('kernel','_\\[k\\]'),]
cats=[(n,re.compile(p)) for n,p in cats]
agg=collections.Counter(); tot=0
for line in open(f):
    stack,_,n=line.rstrip().rpartition(' '); n=int(n); tot+=n
    for name,p in cats:
        if p.search(stack): agg[name]+=n; break
    else: agg['other']+=n
for k,v in agg.most_common():
    print(f"{100*v/tot:6.2f}% {k:18s}" + (f" {v/twins/1e3:6.1f}/twin" if twins else ""))
