//! Micro-benches (criterion) of the hot paths of one twin write, in the order a write meets them:
//! SAS check at the front door, patch validation, the Raft log codec (postcard), and `apply` (merge
//! with `$metadata`, versions, etag, dedupe) on the state machine; then a shard snapshot and the
//! check of a bulk entry's sections.
//!
//!   cargo bench --bench micro                 # all
//!   cargo bench --bench micro -- apply        # one group
//!
//! Numbers are recorded in benches/README.md. Nothing here asserts a duration.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::{json, Map, Value};
use twinhub::auth::{sign, SasToken};
use twinhub::ids::TwinId;
use twinhub::model::{
    validate_twin_patch, validate_twin_section_texts, AuthSpec, Command, DeviceSpec, Op, ShardState, Status,
};

const KEY: &str = "cHJpbWFyeWtleXByaW1hcnlrZXlwcmltYXJ5a2V5MDA=";
const T0: i64 = 1_795_000_000_000;

/// A desired patch like the benches' fleets send: `keys` leaves of about 20 bytes under one object.
fn patch(keys: usize, round: u64) -> Value {
    let mut leaves = Map::new();
    for k in 0..keys {
        leaves.insert(format!("setting{k:03}"), json!(format!("value-{round}-{k:08}")));
    }
    json!({"properties": {"desired": {"config": leaves, "seq": round}}})
}

fn device(id: &str) -> Command {
    let auth = AuthSpec {
        auth_type: twinhub::model::AuthType::Sas,
        primary_key: Some(KEY.into()),
        secondary_key: Some(KEY.into()),
        primary_thumbprint: None,
        secondary_thumbprint: None,
    };
    let spec = DeviceSpec { device_id: id.into(), status: Status::Enabled, status_reason: None, auth, iot_edge: false };
    Command::new(Op::PutDevice { device: spec, if_match: None }, T0)
}

fn update(id: &str, keys: usize, round: u64) -> Command {
    let patch_json = patch(keys, round).to_string();
    Command::new(Op::UpdateTwin { id: TwinId::device(id), patch_json, if_match: None }, T0 + round as i64)
}

fn sas(c: &mut Criterion) {
    let sr = "bench-hub.azure-devices.net%2Fdevices%2Fdevice-000042";
    let se = 4_000_000_000;
    let sig = sign(KEY, sr, se).expect("base64 key");
    let sig = percent_encoding::utf8_percent_encode(
        &base64::Engine::encode(&base64::engine::general_purpose::STANDARD, sig),
        percent_encoding::NON_ALPHANUMERIC,
    )
    .to_string();
    let header = format!("SharedAccessSignature sr={sr}&sig={sig}&se={se}");
    let mut g = c.benchmark_group("sas");
    g.bench_function("parse", |b| b.iter(|| SasToken::parse(black_box(&header)).expect("valid token")));
    let token = SasToken::parse(&header).expect("valid token");
    g.bench_function("check_hmac", |b| b.iter(|| black_box(&token).check(&[KEY], 1_795_000_000).expect("signed")));
    g.finish();
}

fn validate(c: &mut Criterion) {
    let mut g = c.benchmark_group("validate_twin_patch");
    for keys in [1usize, 10, 100] {
        let body = patch(keys, 1);
        g.throughput(Throughput::Bytes(body.to_string().len() as u64));
        g.bench_function(format!("{keys}_leaves"), |b| {
            b.iter(|| validate_twin_patch(black_box(&body)).expect("valid"))
        });
    }
    g.finish();
}

/// The front door's check of a twin PATCH body, as it came: parsed into a tree and the tree checked
/// (how it did), against checked straight from the text (what it does now). The compare's body (one
/// desired member holding a 200-byte object), then 10 and 100 leaves.
fn front_door(c: &mut Criterion) {
    let mut g = c.benchmark_group("twin_body");
    let pad = "abcdefghijklmnopqrstuvwxyz0123456789".repeat(5);
    let compare =
        format!(r#"{{"properties":{{"desired":{{"fb":{{"seq":7,"ts":1795000000000000,"pad":"{}"}}}}}}}}"#, &pad[..167]);
    let bodies =
        [("compare", compare), ("10_leaves", patch(10, 1).to_string()), ("100_leaves", patch(100, 1).to_string())];
    for (name, body) in &bodies {
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("{name}/tree"), |b| {
            b.iter(|| {
                let doc = twinhub::model::validate::parse_json(black_box(body)).expect("json");
                validate_twin_patch(&doc).expect("valid")
            })
        });
        g.bench_function(format!("{name}/front_door_text"), |b| {
            b.iter(|| twinhub::model::validate_twin_body_text(black_box(body)).expect("valid"))
        });
    }
    g.finish();
}

/// A twin document's text written into a JSON message (a forwarded write's answer, a change event),
/// through serde_json's `RawValue` (which reads the text again to check it; how it was done) and as
/// `JsonText` writes itself now.
fn embed(c: &mut Criterion) {
    struct ViaRawValue<'a>(&'a twinhub::model::JsonText);
    impl serde::Serialize for ViaRawValue<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let raw: &serde_json::value::RawValue =
                serde_json::from_str(self.0.as_str()).map_err(serde::ser::Error::custom)?;
            raw.serialize(s)
        }
    }
    let mut state = ShardState::default();
    assert!(state.apply(&device("device-000042")).result.is_ok());
    for round in 0..3 {
        assert!(state.apply(&update("device-000042", 10, round)).result.is_ok());
    }
    let twin = state.twin_text(&TwinId::device("device-000042")).expect("twin");
    let mut g = c.benchmark_group("embed_twin_text");
    g.throughput(Throughput::Bytes(twin.as_str().len() as u64));
    let mut buf = Vec::with_capacity(8 << 10);
    g.bench_function("via_raw_value", |b| {
        b.iter(|| {
            buf.clear();
            serde_json::to_writer(&mut buf, &(1, ViaRawValue(black_box(&twin)))).expect("json");
        })
    });
    g.bench_function("json_text", |b| {
        b.iter(|| {
            buf.clear();
            serde_json::to_writer(&mut buf, &(1, black_box(&twin))).expect("json");
        })
    });
    g.finish();
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec_postcard");
    for keys in [1usize, 100] {
        let cmd = update("device-000042", keys, 7);
        let bytes = postcard::to_allocvec(&cmd).expect("encodable");
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function(format!("encode_update_{keys}_leaves"), |b| {
            b.iter(|| postcard::to_allocvec(black_box(&cmd)).expect("encodable"))
        });
        g.bench_function(format!("decode_update_{keys}_leaves"), |b| {
            b.iter(|| postcard::from_bytes::<Command>(black_box(&bytes)).expect("decodable"))
        });
    }
    // What replication sends a follower during a bulk load: a batch of log entries, each a shard's
    // share of a bulk call (here 16 entries of 8 created twins with tags and a 200-byte value).
    let batch: Vec<Command> = (0..16).map(|i| bulk_create(i * 8, 8)).collect();
    let bytes = postcard::to_allocvec(&batch).expect("encodable");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("encode_bulk_batch", |b| b.iter(|| postcard::to_allocvec(black_box(&batch)).expect("encodable")));
    g.bench_function("decode_bulk_batch", |b| {
        b.iter(|| postcard::from_bytes::<Vec<Command>>(black_box(&bytes)).expect("decodable"))
    });
    g.finish();
}

/// A bulk registry command creating `n` devices from `first` on, each with three tags and a
/// 200-byte desired value, as the memory bench loads them.
fn bulk_create(first: usize, n: usize) -> Command {
    use twinhub::model::bulk::{BulkEntry, Identity, ImportMode};
    let entries = (first..first + n)
        .map(|i| {
            let id = format!("device-{i:07}");
            let Op::PutDevice { device, .. } = device(&id).op else { unreachable!("device() puts a device") };
            BulkEntry {
                id: TwinId::device(&id),
                mode: ImportMode::Create,
                identity: Some(Identity::Device(device)),
                etag: None,
                twin_etag: None,
                tags_json: Some(format!(r#"{{"building":{},"battery":{},"jobgroup":{}}}"#, i % 50, i % 100, i % 10)),
                desired_json: Some(format!(r#"{{"value":"{}"}}"#, "x".repeat(200))),
            }
        })
        .collect();
    Command { request_id: twinhub::model::RequestId(first as u128), timestamp_ms: T0, op: Op::Bulk { entries } }
}

/// `apply` of a desired patch: parse the patch text, merge it into the twin with `$metadata`
/// (`$lastUpdated`, `$lastUpdatedVersion`), bump `$version` and the etag, remember the request id and the
/// reply for dedupe, and produce the change events. Each iteration applies a fresh command (a new
/// request id) to a twin that already holds the previous rounds.
fn apply(c: &mut Criterion) {
    let mut g = c.benchmark_group("apply_update_twin");
    for keys in [1usize, 10, 100] {
        let mut state = ShardState::default();
        assert!(state.apply(&device("device-000042")).result.is_ok());
        for round in 0..50 {
            assert!(state.apply(&update("device-000042", keys, round)).result.is_ok());
        }
        let mut round = 50;
        g.bench_function(format!("{keys}_leaves"), |b| {
            b.iter_batched(
                || {
                    round += 1;
                    update("device-000042", keys, round)
                },
                |cmd| {
                    let applied = state.apply(&cmd);
                    debug_assert!(applied.result.is_ok());
                    applied
                },
                BatchSize::SmallInput,
            )
        });
    }
    // A shard with many devices: the BTreeMap lookup and the dedupe window at their working size.
    let mut state = ShardState::default();
    for d in 0..10_000 {
        assert!(state.apply(&device(&format!("device-{d:06}"))).result.is_ok());
    }
    let mut n = 0u64;
    g.bench_function("1_leaf_among_10k_devices", |b| {
        b.iter_batched(
            || {
                n += 1;
                update(&format!("device-{:06}", n % 10_000), 1, n)
            },
            |cmd| state.apply(&cmd),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// The document a twin write answers, for a twin that took 50 patches of 10 leaves and for one shaped
/// like the compare's (one desired member holding a 200-byte value of three members): built as a JSON
/// tree then written as text (how every replica rendered it first), written through serde straight
/// from the packed twin (how it did until the text writers), and written by the text writers (what
/// apply does now). All three give the same bytes (the model tests check).
fn render(c: &mut Criterion) {
    let mut g = c.benchmark_group("render_twin");
    let mut state = ShardState::default();
    assert!(state.apply(&device("device-000042")).result.is_ok());
    for round in 0..50 {
        assert!(state.apply(&update("device-000042", 10, round)).result.is_ok());
    }
    assert!(state.apply(&device("device-000043")).result.is_ok());
    let pad = "abcdefghijklmnopqrstuvwxyz0123456789".repeat(5);
    let value = format!(r#"{{"seq":7,"ts":1795000000000000,"pad":"{}"}}"#, &pad[..167]);
    let patch_json = format!(r#"{{"properties":{{"desired":{{"fb":{value}}}}}}}"#);
    let op = Op::UpdateTwin { id: TwinId::device("device-000043"), patch_json, if_match: None };
    assert!(state.apply(&Command::new(op, T0)).result.is_ok());
    for (name, id) in [("50x10_leaves", TwinId::device("device-000042")), ("compare", TwinId::device("device-000043"))]
    {
        g.bench_function(format!("{name}/tree_then_text"), |b| {
            b.iter(|| twinhub::model::JsonText::render(&state.twin(black_box(&id)).expect("twin")))
        });
        g.bench_function(format!("{name}/serde_text"), |b| {
            b.iter(|| state.twin_text_via_serde(black_box(&id)).expect("twin"))
        });
        g.bench_function(format!("{name}/text"), |b| b.iter(|| state.twin_text(black_box(&id)).expect("twin")));
    }
    g.finish();
}

/// A shard's snapshot as a bulk-loaded 1M fleet has it at its first snapshot (40,000 twins of a
/// 16-shard fleet, each with three tags and a 200-byte desired value): the image taken, encoded into
/// a buffer of its size, and that written to a file (without fsync). Each iteration writes a new file.
/// Then a small shard whose retry windows are full, as steady writes leave them.
fn snapshot(c: &mut Criterion) {
    let mut state = ShardState::default();
    for first in (0..40_000).step_by(100) {
        assert!(state.apply(&bulk_create(first, 100)).result.is_ok());
    }
    let size = state.encode_snapshot().len();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shard.snap");
    let mut g = c.benchmark_group("snapshot_40k_twins");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function("image", |b| b.iter(|| state.snapshot_image()));
    g.bench_function("encode", |b| b.iter(|| state.snapshot_image().encode(size)));
    g.bench_function("encode_and_write", |b| {
        b.iter(|| {
            let data = state.snapshot_image().encode(size);
            std::fs::write(&path, &data).expect("write");
        })
    });
    g.finish();

    // A small shard after 10,000 twin writes (1,250 twins: one of 8 shards of a 10,000-twin fleet; the
    // compare's default of 3 shards holds about 3,333 each): both retry windows are full (ten thousand
    // outcomes, 4 MiB of replies), and at that size they are most of what a snapshot copies and writes.
    let mut state = ShardState::default();
    for d in 0..1_250 {
        assert!(state.apply(&device(&format!("device-{d:06}"))).result.is_ok());
    }
    for n in 0..10_000u64 {
        assert!(state.apply(&update(&format!("device-{:06}", n % 1_250), 10, n)).result.is_ok());
    }
    let size = state.encode_snapshot().len();
    let mut g = c.benchmark_group("snapshot_after_10k_writes");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function("image", |b| b.iter(|| state.snapshot_image()));
    g.bench_function("encode", |b| b.iter(|| state.snapshot_image().encode(size)));
    g.finish();
}

/// The check of a bulk entry's sections at the front door: the sections parsed into a tree and
/// checked (as before), against checked while their text is read.
fn sections(c: &mut Criterion) {
    let tags = r#"{"building":43,"battery":17,"jobgroup":3}"#;
    let desired = format!(r#"{{"value":"{}"}}"#, "x".repeat(200));
    let mut g = c.benchmark_group("bulk_entry_sections");
    g.bench_function("tree", |b| {
        b.iter(|| {
            let t: Value = serde_json::from_str(black_box(tags)).expect("json");
            let d: Value = serde_json::from_str(black_box(&desired)).expect("json");
            validate_twin_patch(&json!({"tags": t, "properties": {"desired": d}})).expect("valid")
        })
    });
    g.bench_function("text", |b| {
        b.iter(|| validate_twin_section_texts(Some(black_box(tags)), Some(black_box(&desired))).expect("valid"))
    });
    g.finish();
}

/// A desired patch of 1, 10 or 100 leaves merged into a section that took 50 patches of 10 leaves (a
/// patch of 100 adds 90 of its leaves, the others replace): unpacked into a tree,
/// merged and packed again (how every replica merged before), against written straight from the
/// packed bytes (what apply does now). Both give the same bytes (a unit test checks).
fn merge(c: &mut Criterion) {
    use twinhub::model::json_tree::Members;
    use twinhub::model::Packed;
    let section = |v: Value| v["properties"]["desired"].as_object().cloned().unwrap_or_default();
    let mut packed = Packed::empty_section();
    for round in 0..50 {
        packed = packed.merged(&Members::of(&section(patch(10, round))), T0 + round as i64, round as i64 + 2);
    }
    let mut g = c.benchmark_group("merge_section");
    for keys in [1usize, 10, 100] {
        let p = section(patch(keys, 99));
        g.bench_function(format!("{keys}_leaves_tree"), |b| {
            b.iter(|| {
                let mut tree = black_box(&packed).unpack();
                tree.merge(&p, T0 + 99, 101);
                Packed::pack(&tree)
            })
        });
        let members = Members::of(&p);
        g.bench_function(format!("{keys}_leaves_in_place"), |b| {
            b.iter(|| black_box(&packed).merged(&members, T0 + 99, 101))
        });
    }
    g.finish();
}

criterion_group!(benches, sas, validate, front_door, embed, codec, apply, render, snapshot, sections, merge);
criterion_main!(benches);
