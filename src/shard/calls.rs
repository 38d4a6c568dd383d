//! What a node answers its peers about its shards (read indexes, cluster-map writes, event tails),
//! and the client side of a cluster-map write on the metadata leader.

use std::sync::Arc;
use std::time::Duration;

use super::error::ShardError;
use super::group::Shard;
use super::tail;
use super::{Shards, META};
use crate::cluster::transport::Call;
use crate::ids::{NodeId, ShardId};
use crate::model::{Applied, Command};

pub(super) async fn remote_meta_write(meta: &Shard, leader: NodeId, cmd: &Command) -> Result<Applied, ShardError> {
    let Some(t) = &meta.transport else { return Err(ShardError::NotLeader { shard: META, leader: Some(leader) }) };
    let body = serde_json::to_vec(cmd).map_err(|e| ShardError::Fatal { shard: META, msg: e.to_string() })?;
    let answer = t.call(leader, Call::MetaWrite, body.into(), Some(Duration::from_secs(5))).await.map_err(|e| {
        tracing::debug!(leader, "cluster-map change on the metadata leader: {e}");
        ShardError::Timeout { shard: META }
    })?;
    serde_json::from_slice::<Result<Applied, ShardError>>(&answer)
        .map_err(|e| ShardError::Fatal { shard: META, msg: e.to_string() })?
}

fn call_error(e: impl std::fmt::Display) -> crate::cluster::transport::CallError {
    crate::cluster::transport::CallError(e.to_string())
}

/// Answers peers: read indexes, cluster-map writes, event tails.
pub(super) fn register_calls(t: &crate::cluster::transport::Transport, shards: &Arc<Shards>) {
    let s = Arc::downgrade(shards);
    t.handlers().register(Call::ReadIndex, move |_from, body: bytes::Bytes| {
        let s = s.clone();
        async move {
            let id: ShardId =
                postcard::from_bytes(&body).map_err(|e| call_error(format!("bad read-index request: {e}")))?;
            let group = s.upgrade().and_then(|s| if id == META { s.meta.clone() } else { s.local(id) });
            let r = match group {
                Some(g) => g.read_index().await,
                None => Err(ShardError::NotLeader { shard: id, leader: None }),
            };
            postcard::to_allocvec(&r).map(bytes::Bytes::from).map_err(call_error)
        }
    });
    let s = Arc::downgrade(shards);
    t.handlers().register(Call::MetaWrite, move |_from, body: bytes::Bytes| {
        let s = s.clone();
        async move {
            let cmd: Command = serde_json::from_slice(&body).map_err(|e| call_error(format!("bad map change: {e}")))?;
            let r = match s.upgrade().and_then(|s| s.meta.clone()) {
                Some(m) if m.is_leader() => m.write(cmd).await,
                Some(m) => Err(ShardError::NotLeader { shard: META, leader: m.leader() }),
                None => Err(ShardError::NotLeader { shard: META, leader: None }),
            };
            serde_json::to_vec(&r).map(bytes::Bytes::from).map_err(call_error)
        }
    });
    let s = Arc::downgrade(shards);
    t.handlers().register(Call::ShardEvents, move |_from, body: bytes::Bytes| {
        let s = s.clone();
        async move {
            let (id, after): (ShardId, Option<u64>) =
                postcard::from_bytes(&body).map_err(|e| call_error(format!("bad event tail request: {e}")))?;
            let r = match s.upgrade() {
                Some(s) if s.local(id).is_some() => Ok(s.rings.wait_page(id, after, tail::LONG_POLL).await),
                _ => Err(ShardError::NotLeader { shard: id, leader: None }),
            };
            serde_json::to_vec(&r).map(bytes::Bytes::from).map_err(call_error)
        }
    });
}
