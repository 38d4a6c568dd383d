//! Raft storage: every shard group of a node keeps its log and vote in one fjall database
//! (`data_dir/raft`), and one writer task group-commits the writes of every group: one batch, one
//! fsync, then every append of the batch is acknowledged (see [`group_commit`] for the durability
//! argument). Snapshots are files of their own beside it, written and fsynced off that writer.
//!
//! - [`types`]: the openraft type configuration (`Command` in, `Applied` out).
//! - [`store`]: fjall handles, key layout, reads.
//! - [`group_commit`]: the single writer.
//! - [`log_store`]: openraft's `RaftLogStorage` for one shard.
//! - [`log_cache`]: the newest entries of a shard's log in memory, for replication and apply.
//! - [`snapshot_files`]: one durable snapshot file per shard.
//! - [`background`]: the lower-priority thread that encodes and writes snapshots.
//! - [`state_machine`]: openraft's `RaftStateMachine` over `model::ShardState`, durable snapshots.
//!
//! This layer sits on the pure model and below everything that moves bytes between nodes: the
//! cluster transport carries these types, and the shard layer runs groups over them.

pub mod background;
pub mod group_commit;
pub mod log_cache;
pub mod log_store;
pub mod snapshot_files;
pub mod state_machine;
pub mod store;
pub mod types;
