//! A fixed run of twin writes through a shard's apply, for counting what one costs: run it under
//! `valgrind --tool=cachegrind --cache-sim=no` twice, with N and 2N writes, and the difference of the
//! two instruction counts divided by N is one write's, exactly and whatever the machine's load
//! (benches/README.md). The writes are the compare's: `{"properties":{"desired":{"fb":{…}}}}` with a
//! value of 200 bytes, to twins of a shard of 10,000 devices, applied as the leader applies them
//! (`leader`: with change events) or as a follower does (`follower`).
//!
//! `cargo run --release --example apply_count -- N leader|follower`

use twinhub::ids::TwinId;
use twinhub::model::{AuthSpec, AuthType, Command, DeviceSpec, Op, ShardState, Status};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KEY: &str = "cHJpbWFyeWtleXByaW1hcnlrZXlwcmltYXJ5a2V5MDA=";
const T0: i64 = 1_795_000_000_000;
const DEVICES: u64 = 10_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let leader = args.next().as_deref() != Some("follower");
    let mut state = ShardState::default();
    for d in 0..DEVICES {
        let auth = AuthSpec {
            auth_type: AuthType::Sas,
            primary_key: Some(KEY.into()),
            secondary_key: Some(KEY.into()),
            primary_thumbprint: None,
            secondary_thumbprint: None,
        };
        let device = DeviceSpec {
            device_id: format!("device-{d:06}"),
            status: Status::Enabled,
            status_reason: None,
            auth,
            iot_edge: false,
        };
        let applied = state.apply(&Command::new(Op::PutDevice { device, if_match: None }, T0));
        assert!(applied.result.is_ok(), "creating a device: {:?}", applied.result);
    }
    let pad = "x".repeat(150);
    for i in 0..n {
        let patch_json =
            format!(r#"{{"properties":{{"desired":{{"fb":{{"seq":{i},"ts":{},"pad":"{pad}"}}}}}}}}"#, T0 + i as i64);
        let id = TwinId::device(format!("device-{:06}", i.wrapping_mul(7919) % DEVICES));
        let cmd = Command::new(Op::UpdateTwin { id, patch_json, if_match: None }, T0 + i as i64);
        let applied = if leader { state.apply(&cmd) } else { state.apply_quietly(&cmd) };
        assert!(applied.result.is_ok(), "a write: {:?}", applied.result);
    }
}
