//! Reads of a shard's applied state, as values: a node that does not replicate a shard sends the read
//! to one that does (which linearizes it through the shard's leader), so a read is a request that can
//! travel, not a closure.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::TwinId;
use crate::model::{Credentials, DeviceStats, ShardState, TwinError};

/// Transport call that runs a read on a replica of the shard: `postcard((ShardId, ReadOp))` in,
/// `serde_json(Result<ReadOut, ShardError>)` out.
pub const READ_CALL: &str = "twin.read";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReadOp {
    Credentials(TwinId),
    TwinProperties(TwinId),
    Twin(TwinId),
    Device(String),
    Devices { after: Option<String>, limit: usize },
    Modules(String),
    Module(String, String),
    Stats,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReadOut {
    Credentials(Option<Credentials>),
    Doc(Result<Value, TwinError>),
    Docs(Result<Vec<Value>, TwinError>),
    MaybeDoc(Option<Value>),
    Stats(DeviceStats),
}

impl ReadOp {
    pub fn run(&self, s: &ShardState) -> ReadOut {
        match self {
            ReadOp::Credentials(id) => ReadOut::Credentials(s.credentials(id)),
            ReadOp::TwinProperties(id) => ReadOut::Doc(s.twin_properties(id)),
            ReadOp::Twin(id) => ReadOut::Doc(s.twin(id)),
            ReadOp::Device(id) => ReadOut::MaybeDoc(s.device(id)),
            ReadOp::Devices { after, limit } => ReadOut::Docs(Ok(s.devices(after.as_deref(), *limit))),
            ReadOp::Modules(id) => ReadOut::Docs(s.modules(id)),
            ReadOp::Module(d, m) => ReadOut::Doc(s.module(d, m)),
            ReadOp::Stats => ReadOut::Stats(s.stats()),
        }
    }
}

/// A read answered with another kind of result than asked for: a bug or a node of another version.
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer to a read: {0:?}")]
pub struct Mismatch(pub ReadOut);
