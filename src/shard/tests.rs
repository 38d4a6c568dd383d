//! Storage conformance (openraft's suite) and restart tests of the shard layer.

use std::sync::Arc;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::storage::RaftLogStorage;
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::StorageError;

use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::store::Store;
use super::types::TypeConfig;
use super::{Shard, Shards, ShardsConfig};
use crate::ids::{ShardId, TwinId};
use crate::model::{Command, DeviceSpec, Op, Reply};

struct FjallBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for FjallBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().map_err(|e| StorageError::read(TypeConfig::err_from_error(&e)))?;
        let store = Arc::new(Store::open(dir.path()).map_err(|e| StorageError::read(TypeConfig::err_from_error(&e)))?);
        let sm = StateMachine::open(3, store.clone(), None)
            .map_err(|e| StorageError::read(TypeConfig::err_from_error(&e)))?;
        Ok((dir, LogStore::new(3, store), sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fjall_store_passes_openraft_storage_suite() {
    Suite::test_all(FjallBuilder).await.expect("storage suite");
}

fn config(dir: &std::path::Path, shard_count: u32, snapshot_every: u64) -> ShardsConfig {
    ShardsConfig {
        data_dir: dir.to_path_buf(),
        node_id: 1,
        shard_count,
        snapshot_every,
        events: None,
        transport: None,
        members: Default::default(),
        join: None,
        heartbeat_ms: 100,
        proposals_in_flight: crate::config::DEFAULT_PROPOSALS_IN_FLIGHT,
    }
}

fn put_device(id: &str) -> Command {
    Command::new(Op::PutDevice { device: DeviceSpec::test_sas(id), if_match: None }, 1_700_000_000_000)
}

fn report(id: &str, n: u64) -> Command {
    Command::new(
        Op::UpdateReported { id: TwinId::device(id), patch_json: format!("{{\"n\":{n}}}") },
        1_700_000_000_000 + n as i64,
    )
}

fn must_reported_version(r: &Reply) -> i64 {
    match r {
        Reply::Reported { version } => *version,
        other => panic!("expected Reported, got {other:?}"),
    }
}

/// Proposes `n` reported patches of `id` back to back without waiting, then checks that they answer
/// in proposal order with consecutive versions; the last version.
async fn pipeline_reports(shard: &Shard, id: &str, n: u64) -> i64 {
    let mut rxs = Vec::new();
    for i in 1..=n {
        let (tx, rx) = tokio::sync::oneshot::channel();
        shard.write_pipelined(report(id, i), tx).await;
        rxs.push(rx);
    }
    let mut versions = Vec::new();
    for rx in rxs {
        let applied = rx.await.expect("answered").expect("applied");
        versions.push(must_reported_version(applied.result.as_ref().expect("ok")));
    }
    assert!(versions.windows(2).all(|w| w[1] == w[0] + 1), "{versions:?}");
    *versions.last().expect("at least one write")
}

/// The twin as a linearizable read sees it: (reported `$version`, reported `n`).
async fn must_twin(shards: &Shards, id: &str) -> (i64, i64) {
    let twin = shards
        .local(shards.shard_of(id))
        .unwrap()
        .read(|s| s.twin(&TwinId::device(id)))
        .await
        .expect("read")
        .expect("twin");
    let reported = &twin["properties"]["reported"];
    (reported["$version"].as_i64().expect("$version"), reported["n"].as_i64().expect("n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_survive_reopen_and_versions_continue() {
    let dir = tempfile::tempdir().unwrap();
    let shards = Shards::open(config(dir.path(), 4, 10_000)).await.expect("open");
    assert_eq!(shards.shard_count(), 4);

    for d in ["dev-a", "dev-b", "dev-c"] {
        let applied = shards.local(shards.shard_of(d)).unwrap().write(put_device(d)).await.expect("write");
        assert!(matches!(applied.result, Ok(Reply::Device(_))), "{applied:?}");
    }
    // Pipelined writes answer in proposal order with consecutive versions.
    let last = pipeline_reports(&shards.local(shards.shard_of("dev-a")).unwrap(), "dev-a", 20).await;
    assert_eq!(must_twin(&shards, "dev-a").await, (last, 20));
    shards.shutdown().await;
    drop(shards);

    let shards = Shards::open(config(dir.path(), 4, 10_000)).await.expect("reopen");
    assert_eq!(must_twin(&shards, "dev-a").await, (last, 20));
    for d in ["dev-b", "dev-c"] {
        assert!(shards.local(shards.shard_of(d)).unwrap().read_local(|s| s.device(d)).is_some(), "{d} lost");
    }
    let applied =
        shards.local(shards.shard_of("dev-a")).unwrap().write(report("dev-a", 21)).await.expect("write after reopen");
    assert_eq!(must_reported_version(applied.result.as_ref().expect("ok")), last + 1);
    shards.shutdown().await;
}

/// Writes that queue while the shard's entries are out share the next entry, and still answer in
/// order with consecutive versions; with batching off, every write is an entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_share_entries_and_keep_their_order() {
    for (in_flight, batched) in [(2, true), (0, false)] {
        let dir = tempfile::tempdir().unwrap();
        let shards = Shards::open(ShardsConfig { proposals_in_flight: in_flight, ..config(dir.path(), 1, 10_000) })
            .await
            .expect("open");
        let shard = shards.local(0).unwrap().clone();
        shard.write(put_device("dev-q")).await.expect("create");
        let before = shard.status().last_log_index;
        pipeline_reports(&shard, "dev-q", 60).await;
        let entries = shard.status().last_log_index - before;
        if batched {
            assert!(entries < 30, "60 queued writes took {entries} entries");
        } else {
            assert_eq!(entries, 60);
        }
        shards.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_and_purge_then_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let shards = Shards::open(config(dir.path(), 1, 10)).await.expect("open");
    let shard = shards.local(0).unwrap().clone();
    shard.write(put_device("dev-s")).await.expect("create");
    let mut last = 0;
    for n in 1..=60 {
        let applied = shard.write(report("dev-s", n)).await.expect("write");
        last = must_reported_version(applied.result.as_ref().expect("ok"));
    }
    // The snapshot policy (asked once a second on a node, here every 50 ms) builds a snapshot, and
    // Raft purges the log behind it.
    let wait = shard.raft.wait(Some(std::time::Duration::from_secs(10)));
    let snapshotted = wait.metrics(|m| m.purged.is_some() && m.snapshot.is_some(), "snapshot and purge");
    let policy = async {
        loop {
            shards.snapshot_heavy_groups().await;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        done = snapshotted => { done.expect("snapshot + purge"); }
        _ = policy => {}
    }
    let seen = shard.raft.metrics().borrow_watched().purged.expect("purged");
    // A purge deletes its entries in the background and a shutdown does not wait for that (entries
    // left behind are garbage that the next purge deletes, from where the last one recorded it
    // stopped). So wait until the purges have settled and their deletions are done before the disk
    // is checked below.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut settled = None;
    loop {
        let purged = shard.raft.metrics().borrow_watched().purged.expect("purged");
        let done = shards.store.entries(0, 0, purged.index + 1).expect("entries").is_empty();
        if done && settled == Some(purged) {
            break;
        }
        settled = done.then_some(purged);
        assert!(std::time::Instant::now() < deadline, "purged entries not deleted within 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    shards.shutdown().await;
    drop((shard, shards));

    // What is on disk: a snapshot, and a log starting after the purge point (which may have moved on
    // after `seen`, while the last writes were being snapshotted).
    {
        let store = Arc::new(Store::open(&dir.path().join("raft")).expect("store"));
        let (meta, _) = store.snapshot(0).expect("read").expect("snapshot stored");
        let mut log = LogStore::new(0, store.clone());
        let state = log.get_log_state().await.expect("log state");
        let purged = state.last_purged_log_id.expect("purge recorded");
        assert!(purged >= seen, "purge point went back: {purged:?} < {seen:?}");
        assert!(meta.last_log_id >= Some(purged), "snapshot {meta:?} behind purge {purged:?}");
        assert!(store.entries(0, 0, purged.index + 1).expect("entries").is_empty(), "purged entries still there");
        store.writer.stop().await.expect("stop");
    }

    let shards = Shards::open(config(dir.path(), 1, 10)).await.expect("reopen");
    assert_eq!(must_twin(&shards, "dev-s").await, (last, 60));
    let applied = shards.local(0).unwrap().write(report("dev-s", 61)).await.expect("write after reopen");
    assert_eq!(must_reported_version(applied.result.as_ref().expect("ok")), last + 1);
    shards.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_after_shutdown_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let shards = Shards::open(config(dir.path(), 1, 10_000)).await.expect("open");
    shards.shutdown().await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    shards.local(0).unwrap().write_pipelined(report("x", 1), tx).await;
    assert!(matches!(rx.await.expect("answered"), Err(super::ShardError::ShuttingDown { .. })));
    assert!(shards.local(0).unwrap().write(report("x", 2)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_failure_stops_the_shard_instead_of_acknowledging() {
    let dir = tempfile::tempdir().unwrap();
    let shards = Shards::open(config(dir.path(), 1, 10_000)).await.expect("open");
    let shard = shards.local(0).unwrap().clone();
    shard.write(put_device("dev-f")).await.expect("healthy write");

    shards.store.writer.inject_failure();
    let err = shard.write(report("dev-f", 1)).await.expect_err("must not acknowledge");
    assert!(matches!(err, super::ShardError::Storage { .. }), "{err:?}");
    let (tx, rx) = tokio::sync::oneshot::channel();
    shard.write_pipelined(report("dev-f", 2), tx).await;
    let err = rx.await.expect("answered").expect_err("must not acknowledge");
    assert!(matches!(err, super::ShardError::Storage { .. }), "{err:?}");
    // Nothing of the failed writes was applied.
    let reported = shard.read_local(|s| s.twin(&TwinId::device("dev-f"))).expect("twin");
    assert!(reported["properties"]["reported"].get("n").is_none(), "{reported}");
    shards.shutdown().await;
}

/// `n` device ids that live in `shard`.
fn ids_in(shards: &Shards, shard: ShardId, n: usize) -> Vec<String> {
    (0..).map(|i| format!("bulk-{i}")).filter(|id| shards.shard_of(id) == shard).take(n).collect()
}

/// One bulk registry command creating `ids`.
fn bulk_creates(ids: &[String]) -> Command {
    use crate::model::bulk::{BulkEntry, Identity, ImportMode};
    let entries = ids
        .iter()
        .map(|id| BulkEntry {
            id: TwinId::device(id),
            mode: ImportMode::Create,
            identity: Some(Identity::Device(DeviceSpec::test_sas(id))),
            etag: None,
            twin_etag: None,
            tags_json: None,
            desired_json: None,
        })
        .collect();
    Command::new(Op::Bulk { entries }, 1_700_000_000_000)
}

/// Bulk-loaded shards reach the work threshold together; they are snapshotted one after the other,
/// the heaviest first, never two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_groups_are_snapshotted_one_at_a_time_heaviest_first() {
    let dir = tempfile::tempdir().unwrap();
    // 1,000 entries are not reached (a hundred creates per entry); the work threshold is 4 × 1,000
    // twin writes, this node's own in [4,000, 6,000): 4,166, 4,666 and 5,166 for shards 0, 1, 2.
    let shards = Shards::open(config(dir.path(), 3, 1000)).await.expect("open");
    for (shard, n) in [(0, 5400), (1, 5800), (2, 5600)] {
        let s = shards.local(shard).unwrap().clone();
        for chunk in ids_in(&shards, shard, n).chunks(100) {
            let applied = s.write(bulk_creates(chunk)).await.expect("bulk write");
            assert!(applied.result.is_ok(), "{:?}", applied.result);
        }
    }
    let snapshotted = |shards: &Shards| -> Vec<ShardId> {
        (0..3).filter(|&id| shards.local(id).unwrap().raft.metrics().borrow_watched().snapshot.is_some()).collect()
    };
    assert!(snapshotted(&shards).is_empty(), "no snapshot before the work policy runs");
    let wait_for = |id: ShardId| {
        let raft = shards.local(id).unwrap().raft.clone();
        async move {
            raft.wait(Some(std::time::Duration::from_secs(20)))
                .metrics(|m| m.snapshot.is_some(), "snapshot built")
                .await
                .expect("snapshot");
        }
    };
    shards.snapshot_heavy_groups().await;
    wait_for(1).await;
    assert_eq!(snapshotted(&shards), [1], "one group, the heaviest");
    shards.snapshot_heavy_groups().await;
    wait_for(2).await;
    assert_eq!(snapshotted(&shards), [1, 2]);
    shards.snapshot_heavy_groups().await;
    wait_for(0).await;
    shards.shutdown().await;
}

/// A snapshot encodes the whole shard: once a shard is large, it waits for a quarter of its device
/// count in twin writes, however many entries and writes the other thresholds would have let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_shards_wait_for_writes_in_proportion_to_their_size() {
    let dir = tempfile::tempdir().unwrap();
    // Thresholds on this node (id 1, shard 0 of 1): 10 entries, 40 twin writes, and after the first
    // snapshot of 2,000 devices a floor of 500 in [500, 750): 541.
    let shards = Shards::open(config(dir.path(), 1, 10)).await.expect("open");
    let shard = shards.local(0).unwrap().clone();
    let ids = ids_in(&shards, 0, 2000);
    for chunk in ids.chunks(100) {
        let applied = shard.write(bulk_creates(chunk)).await.expect("bulk write");
        assert!(applied.result.is_ok(), "{:?}", applied.result);
    }
    assert!(shards.snapshot_due(&shard), "a new shard is due after 40 writes");
    shards.snapshot_heavy_groups().await;
    shard
        .raft
        .wait(Some(std::time::Duration::from_secs(20)))
        .metrics(|m| m.snapshot.is_some(), "first snapshot")
        .await
        .expect("snapshot");
    assert_eq!(shard.work.devices(), 2000);
    for n in 1..=400 {
        shard.write(report(&ids[0], n)).await.expect("write");
    }
    assert!(shard.work.entries_since_snapshot() >= 400, "{}", shard.work.entries_since_snapshot());
    assert!(!shards.snapshot_due(&shard), "400 writes, 400 entries: below the floor of 541");
    // What the node's gauges show: how much a restart would re-apply, and where the next snapshot is.
    let status = shards.status().into_iter().find(|s| s.shard == 0).expect("status of shard 0");
    assert_eq!((status.writes_since_snapshot, status.snapshot_due_writes), (400, 541), "{status:?}");
    assert!(status.snapshot_index > 0 && status.snapshot_index < status.applied, "{status:?}");
    for n in 401..=545 {
        shard.write(report(&ids[0], n)).await.expect("write");
    }
    assert!(shards.snapshot_due(&shard), "545 writes since the snapshot: due");
    shards.shutdown().await;
}

#[test]
fn replicas_of_a_shard_and_the_shards_of_a_node_snapshot_at_different_counts() {
    let (every, shards) = (10_000, 8);
    let mut seen = std::collections::BTreeSet::new();
    for shard in (0..shards).chain([super::META]) {
        for node in 1..=3 {
            let t = super::snapshot_threshold(every, shard, shards, node);
            assert!((every..every + every / 2).contains(&t), "shard {shard} node {node}: {t}");
            assert!(seen.insert(t), "shard {shard} node {node}: {t} taken twice");
        }
    }
    // Apart by more than a few entries: at half load a shard takes about 200 entries a second.
    let t: Vec<u64> = (1..=3).map(|node| super::snapshot_threshold(every, 2, shards, node)).collect();
    assert!(t.windows(2).all(|w| w[0].abs_diff(w[1]) >= 150), "{t:?}");
    assert_eq!(super::snapshot_threshold(every, 0, shards, 3), every, "the first slot starts at N");
}
