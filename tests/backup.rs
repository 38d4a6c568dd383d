//! `twinhub backup` and `twinhub restore` against real clusters: a backup of a 3-node cluster taken
//! while writes run, restored into a new 3-node cluster, holds every write acknowledged before the
//! backup began and none twice; jobs, configurations and device keys come along; damaged files and
//! non-empty targets are refused without touching anything, and so are pages whose counters (etags,
//! `$version`s) are past what a later increment could take without wrapping around.

use twinhub_testkit as common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cluster::{twinhub_cmd, Cluster};
use common::*;
use serde_json::{json, Value};

const SHARDS: u32 = 4;
const TWINS: usize = 24;

fn run(args: &[&str]) -> (bool, String) {
    let out = twinhub_cmd().args(args).output().expect("run twinhub");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_every_acknowledged_write_once() {
    let a = Cluster::up(3, SHARDS);
    let api = a.api(1);
    let twins: Vec<String> = (0..TWINS).map(|i| format!("bk-{i:02}")).collect();
    let mut keys = BTreeMap::new();
    for t in &twins {
        let doc = api.must_create_device(t).await;
        keys.insert(
            t.clone(),
            doc.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str).unwrap().to_string(),
        );
    }
    api.must(200, "PUT", "/configurations/keep", Some(&json!({"content": {"deviceContent": {"properties.desired.cfg": 1}}, "targetCondition": "deviceId = 'none'", "priority": 3})), &[]).await;

    // Writers: desired.n = 1, 2, 3… per twin, each acknowledged value recorded.
    let acked: Arc<Mutex<BTreeMap<String, i64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for (w, chunk) in twins.chunks(TWINS / 4).enumerate() {
        let (api, acked, stop, chunk) = (a.api(1 + (w as u64 % 3)), acked.clone(), stop.clone(), chunk.to_vec());
        writers.push(tokio::spawn(async move {
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                for t in &chunk {
                    let r = api
                        .send("PATCH", &format!("/twins/{t}"), Some(&json!({"properties": {"desired": {"n": n}}})), &[])
                        .await;
                    if r.status == 200 {
                        acked.lock().unwrap().insert(t.clone(), n);
                    } else {
                        panic!("write to {t} failed: {} {}", r.status, r.text);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = acked.lock().unwrap().clone();
    assert_eq!(before.len(), TWINS, "every twin has acknowledged writes before the backup");
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("cluster.backup");
    let (dir, out) = (a.dir.clone(), file.clone());
    let (ok, text) = tokio::task::spawn_blocking(move || {
        run(&["backup", "--dir", dir.to_str().unwrap(), "--out", out.to_str().unwrap(), "--page", "5"])
    })
    .await
    .unwrap();
    assert!(ok, "backup failed:\n{text}");
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600, "the backup holds keys: 0600");

    // Damaged or foreign files are refused before any cluster is touched.
    let bytes = std::fs::read(&file).unwrap();
    let damaged = root.path().join("damaged.backup");
    let mut flipped = bytes.clone();
    let at = bytes.len() / 2;
    flipped[at] ^= 0x01;
    std::fs::write(&damaged, &flipped).unwrap();
    let (ok, text) = run(&["restore", "--check", "--in", damaged.to_str().unwrap()]);
    assert!(!ok && (text.contains("checksum") || text.contains("record")), "{text}");
    std::fs::write(&damaged, &bytes[..bytes.len() - 100]).unwrap();
    let (ok, text) = run(&["restore", "--check", "--in", damaged.to_str().unwrap()]);
    assert!(!ok && text.contains("truncated"), "{text}");
    let (ok, text) = run(&["restore", "--check", "--in", file.to_str().unwrap()]);
    assert!(ok, "{text}");

    // Restore into a new cluster; a non-empty one is refused.
    let b = Cluster::up(3, SHARDS);

    // A page or metadata record whose counters could wrap around later (a damaged or hand-made backup) is
    // refused with the counter named, and nothing of it is taken.
    let (shard, page) = first_page_with_devices(&api).await;
    let victim = page["devices"].as_object().and_then(|d| d.keys().next().cloned()).unwrap();
    let path = format!("/cluster/restore/shards/{shard}");
    let mut forged = page.clone();
    forged["etag_seq"] = json!(u64::MAX);
    let r = b.api(1).send("POST", &path, Some(&forged), &[]).await;
    assert!(r.status == 400 && r.text.contains("etag_seq is 18446744073709551615"), "{} {}", r.status, r.text);
    let mut forged = page.clone();
    forged["devices"][&victim]["twin"]["version"] = json!(i64::MAX);
    let r = b.api(2).send("POST", &path, Some(&forged), &[]).await;
    assert!(r.status == 400 && r.text.contains(&format!("device {victim}'s twin $version")), "{} {}", r.status, r.text);
    let mut meta = api.must_get("/cluster/backup/meta").await;
    meta["configs"]["etag_seq"] = json!(1u64 << 60);
    let r = b.api(1).send("POST", "/cluster/restore/meta", Some(&meta), &[]).await;
    assert!(r.status == 400 && r.text.contains("configurations' etag_seq"), "{} {}", r.status, r.text);
    b.api(3).must(404, "GET", &format!("/twins/{victim}"), None, &[]).await;
    b.api(3).must(404, "GET", "/configurations/keep", None, &[]).await;

    let (dir, input) = (b.dir.clone(), file.clone());
    let (ok, text) = tokio::task::spawn_blocking(move || {
        run(&["restore", "--dir", dir.to_str().unwrap(), "--in", input.to_str().unwrap()])
    })
    .await
    .unwrap();
    assert!(ok, "restore failed:\n{text}");
    let (ok, text) = run(&["restore", "--dir", b.dir.to_str().unwrap(), "--in", file.to_str().unwrap()]);
    assert!(!ok && text.contains("already has"), "{text}");
    let (ok, text) = run(&["restore", "--resume", "--dir", b.dir.to_str().unwrap(), "--in", file.to_str().unwrap()]);
    assert!(ok, "a resumed restore completes and changes nothing:\n{text}");

    for node in b.ids() {
        let api_b = b.api(node);
        for t in &twins {
            let twin = api_b.must_get_twin(t).await;
            let n = twin["properties"]["desired"]["n"].as_i64().unwrap_or_else(|| panic!("{t} on node {node}: {twin}"));
            assert!(n >= before[t], "{t}: restored n={n} but {} was acknowledged before the backup began", before[t]);
            // Each write bumps desired $version by one from 1: a lost or doubled write breaks this.
            assert_eq!(desired_version(&twin), n + 1, "{t}: $version {} for n={n}", desired_version(&twin));
        }
    }
    let api_b = b.api(2);
    let dev = api_b.must_get("/devices/bk-03").await;
    assert_eq!(
        dev.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str),
        Some(keys["bk-03"].as_str())
    );
    let cfg = api_b.must_get("/configurations/keep").await;
    assert_eq!(cfg["priority"], 3);
    // New writes continue above the restored versions.
    let t = api_b.must_patch_twin("bk-00", &json!({"properties": {"desired": {"after": true}}})).await;
    let restored = b.api(1).must_get_twin("bk-01").await;
    assert!(desired_version(&t) >= 2 && desired_version(&restored) >= 2);
    a.assert_no_panics();
    b.assert_no_panics();
}

/// The first shard of the cluster behind `api` that holds a device, and its first backup page.
async fn first_page_with_devices(api: &Api) -> (u32, Value) {
    let shards = api.must_get("/cluster/backup").await["shardCount"].as_u64().unwrap() as u32;
    for shard in 0..shards {
        let r = api.must_get(&format!("/cluster/backup/shards/{shard}?limit=2")).await;
        if r["page"]["devices"].as_object().is_some_and(|d| !d.is_empty()) {
            return (shard, r["page"].clone());
        }
    }
    panic!("no shard of {shards} holds a device");
}
