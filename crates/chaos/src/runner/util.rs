//! Small shared pieces: the run clock every recorded op uses, progress lines, SAS tokens.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

pub const API_VERSION: &str = "2021-04-12";

static START: OnceLock<Instant> = OnceLock::new();

/// The instant the run started: the epoch of every `invoke_ns`/`complete_ns` in the histories.
pub fn start() -> Instant {
    *START.get_or_init(Instant::now)
}

/// Nanoseconds since the run started (monotonic, shared by every client of the run).
pub fn now_ns() -> u64 {
    start().elapsed().as_nanos() as u64
}

pub fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs()
}

/// A progress line on stderr, stamped with the run clock.
pub fn progress(msg: impl AsRef<str>) {
    eprintln!("[chaos {:>7.1}s] {}", start().elapsed().as_secs_f64(), msg.as_ref());
}

#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => { $crate::runner::util::progress(format!($($arg)*)) };
}

pub use twinhub::auth::client::path_segment as enc;

/// The iothubowner service token for `host_name`, valid for an hour.
pub fn service_sas(host_name: &str, key_b64: &str) -> String {
    // The harness generated the owner key itself: it is base64, so this cannot fail.
    twinhub::auth::client::service_token(host_name, "iothubowner", key_b64, unix_now() + 3600).unwrap_or_default()
}

/// A device token (`sr = host/devices/id`), valid for an hour.
pub fn device_sas(host_name: &str, device: &str, key_b64: &str) -> String {
    twinhub::auth::client::device_token(host_name, device, key_b64, unix_now() + 3600).unwrap_or_default()
}

/// 32 random bytes, base64: an owner key or a cluster secret.
pub fn random_key() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    B64.encode(b)
}

/// Shard of a device id, as twinhub computes it (`ids::shard_of`).
pub fn shard_of(device_id: &str, shard_count: u32) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(device_id.as_bytes()) % u64::from(shard_count.max(1))) as u32
}
