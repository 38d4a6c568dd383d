//! Small shared pieces: the run clock every recorded op uses, progress lines, SAS tokens.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

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
    ($($arg:tt)*) => { $crate::chaos::runner::util::progress(format!($($arg)*)) };
}

/// Python's `urllib.parse.quote(s, safe=safe)`: keeps ASCII alphanumerics, `_.-~` and `safe`.
pub fn py_quote(s: &str, safe: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        let c = b as char;
        if c.is_ascii_alphanumeric() || "_.-~".contains(c) || (b < 128 && safe.contains(c)) {
            out.push(c);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// base64(HMAC-SHA256(base64decode(key), msg)).
pub fn sign(key_b64: &str, msg: &str) -> String {
    let key = B64.decode(key_b64).unwrap_or_default();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("hmac accepts any key length");
    mac.update(msg.as_bytes());
    B64.encode(mac.finalize().into_bytes())
}

/// The iothubowner service token for `host_name`, valid for an hour.
pub fn service_sas(host_name: &str, key_b64: &str) -> String {
    let expiry = unix_now() + 3600;
    let sr = py_quote(host_name, "");
    let sig = sign(key_b64, &format!("{sr}\n{expiry}"));
    format!("SharedAccessSignature sr={sr}&sig={}&se={expiry}&skn=iothubowner", py_quote(&sig, ""))
}

/// A device token (`sr = host/devices/id`), valid for an hour.
pub fn device_sas(host_name: &str, device: &str, key_b64: &str) -> String {
    let expiry = unix_now() + 3600;
    let sr = py_quote(&format!("{host_name}/devices/{device}"), "");
    let sig = sign(key_b64, &format!("{sr}\n{expiry}"));
    format!("SharedAccessSignature sr={sr}&sig={}&se={expiry}", py_quote(&sig, ""))
}

/// Percent-encodes a path segment.
pub fn enc(s: &str) -> String {
    py_quote(s, "!'()*")
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
