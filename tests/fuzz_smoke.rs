//! The fuzz smoke run: every entry point of `twinhub::fuzzing` fed a time budget of inputs made from
//! its seed corpus (`fuzz/seeds/<target>/`) by random mutation (bit flips, byte changes, insertions,
//! deletions, truncation, splices of two seeds, dictionary tokens from `fuzz/dicts/<target>.dict`,
//! integer edge values). Stable Rust, no instrumentation: it is what CI can afford on every run,
//! while the libFuzzer targets in `fuzz/` are for long coverage-guided runs (see `fuzz/README.md`).
//!
//! Any panic fails the test, including one caught inside the server code (the MQTT codec catches
//! rumqttd's panics, which would still be bugs to report). A failing input is written to
//! `target/fuzz-smoke/` and the message says how to replay it.
//!
//! Knobs (environment):
//! - `FUZZ_SMOKE_SECS`: seconds per target (default 3; `scripts/test.sh` gives more).
//! - `FUZZ_SMOKE_SEED`: the mutation seed (default fixed, so a run is reproducible; printed).
//! - `FUZZ_SMOKE_INPUT`: a file to replay through every target instead of mutating.
//!
//! `cargo test --test fuzz_smoke -- --ignored write_seeds` regenerates the seed corpora.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use twinhub::fuzzing;

const DEFAULT_SEED: u64 = 0x7417_4ab5_f022_2026;
const DEFAULT_SECS: f64 = 3.0;
/// Inputs longer than this are cut: the parsers' interesting states are reached with short inputs,
/// and a debug build is slow on long ones.
const MAX_LEN: usize = 16 * 1024;
/// Each target runs on its own thread with this stack. The server runs optimised code, whose frames
/// are several times smaller than those of this unoptimised test build: 8 MiB here stands for the
/// 2 MiB of a release worker thread, so that a recursion the server survives does not fail here.
const STACK: usize = 8 * 1024 * 1024;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------------
// The tests: one per entry point.

#[test]
fn fuzz_smoke_sas_token() {
    run("sas_token", fuzzing::sas_token);
}

#[test]
fn fuzz_smoke_mqtt_packets() {
    run("mqtt_packets", fuzzing::mqtt_packets);
}

#[test]
fn fuzz_smoke_http_request() {
    run("http_request", fuzzing::http_request);
}

#[test]
fn fuzz_smoke_twin_json() {
    run("twin_json", fuzzing::twin_json);
}

#[test]
fn fuzz_smoke_query_parse() {
    run("query_parse", fuzzing::query);
}

#[test]
fn fuzz_smoke_cluster_wire() {
    run("cluster_wire", fuzzing::cluster_wire);
}

// ---------------------------------------------------------------------------------------------------
// The driver.

thread_local! {
    /// Set while an input runs on this thread: the panic hook records instead of printing.
    static IN_INPUT: RefCell<bool> = const { RefCell::new(false) };
    /// The first panic of the current input, caught or not.
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic hook that records panics of inputs (even ones the code under test catches) and leaves
/// every other panic to the default hook, so test failures still print.
fn install_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_INPUT.with(|f| *f.borrow()) {
                let msg = format!("{info}");
                PANIC.with(|p| {
                    p.borrow_mut().get_or_insert(msg);
                });
            } else {
                default(info);
            }
        }));
    });
}

/// Runs `f` on `input`; the panic message if it panicked anywhere.
fn check(f: fn(&[u8]), input: &[u8]) -> Option<String> {
    IN_INPUT.with(|x| *x.borrow_mut() = true);
    PANIC.with(|p| *p.borrow_mut() = None);
    let r = std::panic::catch_unwind(|| f(input));
    IN_INPUT.with(|x| *x.borrow_mut() = false);
    let recorded = PANIC.with(|p| p.borrow_mut().take());
    match (r, recorded) {
        (_, Some(msg)) => Some(msg),
        (Err(_), None) => Some("panicked (no message)".into()),
        (Ok(()), None) => None,
    }
}

fn env_f64(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn env_seed() -> u64 {
    match std::env::var("FUZZ_SMOKE_SEED") {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("FUZZ_SMOKE_SEED '{v}' is not a number"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

fn run(name: &'static str, f: fn(&[u8])) {
    install_hook();
    let handle = std::thread::Builder::new()
        .name(format!("fuzz-{name}"))
        .stack_size(STACK)
        .spawn(move || drive(name, f))
        .expect("spawn the fuzz thread");
    if let Err(e) = handle.join() {
        std::panic::resume_unwind(e);
    }
}

fn drive(name: &'static str, f: fn(&[u8])) {
    if let Ok(path) = std::env::var("FUZZ_SMOKE_INPUT") {
        let input = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        if let Some(msg) = check(f, &input) {
            panic!("{name}: {path} panics: {msg}");
        }
        println!("{name}: {path} passes");
        return;
    }
    let seeds = read_dir_files(&manifest_dir().join("fuzz/seeds").join(name));
    assert!(!seeds.is_empty(), "no seeds in fuzz/seeds/{name}");
    let dict = read_dict(&manifest_dir().join("fuzz/dicts").join(format!("{name}.dict")));
    let seed = env_seed();
    let budget = Duration::from_secs_f64(env_f64("FUZZ_SMOKE_SECS").unwrap_or(DEFAULT_SECS).max(0.0));
    let mut rng = Rng(seed ^ fnv(name.as_bytes()));
    let start = Instant::now();
    let mut n: u64 = 0;
    let fail = |input: &[u8], what: &str, msg: String| -> ! {
        let dir = manifest_dir().join("target/fuzz-smoke");
        let path = dir.join(format!("{name}-crash-{:016x}", fnv(input)));
        let saved = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input));
        let shown = if input.len() <= 512 { format!("{input:02x?}") } else { format!("{} bytes", input.len()) };
        panic!(
            "fuzz smoke {name}: {what} panics: {msg}\ninput: {shown}\nsaved: {} ({saved:?})\nreplay: \
             FUZZ_SMOKE_INPUT={} cargo test --test fuzz_smoke {name}\n(run seed FUZZ_SMOKE_SEED={seed:#x})",
            path.display(),
            path.display()
        )
    };
    // Every seed as is first: a seed that fails is a broken build, not a fuzz finding.
    for s in &seeds {
        if let Some(msg) = check(f, s) {
            fail(s, "a seed", msg);
        }
        n += 1;
    }
    let mut last: Vec<u8> = Vec::new();
    while start.elapsed() < budget {
        // Mostly fresh mutants of a seed; sometimes a mutant of the last mutant (deeper changes).
        let base =
            if !last.is_empty() && rng.below(4) == 0 { last.clone() } else { seeds[rng.below(seeds.len())].clone() };
        let input = mutate(&mut rng, base, &seeds, &dict);
        if let Some(msg) = check(f, &input) {
            fail(&input, &format!("mutant #{n}"), msg);
        }
        last = input;
        n += 1;
    }
    println!(
        "fuzz smoke {name}: seed {seed:#x}, {n} inputs ({} seeds, {} dictionary tokens) in {:.1} s, no panic",
        seeds.len(),
        dict.len(),
        start.elapsed().as_secs_f64()
    );
}

fn read_dir_files(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect();
    paths.sort();
    paths
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .map(|mut v| {
            v.truncate(MAX_LEN);
            v
        })
        .collect()
}

/// A libFuzzer dictionary: one `"token"` (or `name="token"`) per line, `\\`, `\"` and `\xNN` escapes.
fn read_dict(path: &Path) -> Vec<Vec<u8>> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (Some(a), Some(b)) = (line.find('"'), line.rfind('"')) else { continue };
        if b <= a {
            continue;
        }
        let raw = &line.as_bytes()[a + 1..b];
        let mut tok = Vec::new();
        let mut i = 0;
        while i < raw.len() {
            match raw[i] {
                b'\\' if raw.get(i + 1) == Some(&b'x') && i + 3 < raw.len() + 1 => {
                    let hex = std::str::from_utf8(&raw[i + 2..(i + 4).min(raw.len())]).unwrap_or("");
                    match u8::from_str_radix(hex, 16) {
                        Ok(v) => {
                            tok.push(v);
                            i += 4;
                        }
                        Err(_) => {
                            tok.push(b'\\');
                            i += 1;
                        }
                    }
                }
                b'\\' if i + 1 < raw.len() => {
                    tok.push(raw[i + 1]);
                    i += 2;
                }
                c => {
                    tok.push(c);
                    i += 1;
                }
            }
        }
        if !tok.is_empty() {
            out.push(tok);
        }
    }
    out
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

/// SplitMix64: small, fast, and the same sequence on every platform and Rust version.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// Edge values that parsers trip on: lengths, signs, UTF-8 lead bytes, MQTT varint continuation.
const INTERESTING: &[&[u8]] = &[
    b"\x00",
    b"\x01",
    b"\x7f",
    b"\x80",
    b"\xff",
    b"\xff\xff",
    b"\x00\x00",
    b"\xff\xff\xff\x7f",
    b"\x80\x80\x80\x80\x01",
    b"-1",
    b"0",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"18446744073709551616",
    b"1e308",
    b"4503599627370496",
    b"\xc3\xa9",
    b"\xe2\x82",
    b"\xf0\x9f\x98\x80",
    b"%",
    b"%zz",
    b"%00",
    b"%C3%A9",
    b"&",
    b"=",
    b"/",
    b"?",
    b"\n",
    b"\r\n",
    b"\"",
    b"\\",
    b"[",
    b"{",
    b"}",
    b"]",
    b"null",
];

fn mutate(rng: &mut Rng, mut v: Vec<u8>, seeds: &[Vec<u8>], dict: &[Vec<u8>]) -> Vec<u8> {
    let span = 1 << rng.below(4);
    let rounds = 1 + rng.below(span);
    for _ in 0..rounds {
        let len = v.len();
        match rng.below(12) {
            // Flip one bit.
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            // Set one byte.
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.byte();
            }
            // Insert random bytes.
            2 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(4);
                for _ in 0..n {
                    v.insert(i, rng.byte());
                }
            }
            // Delete a range.
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(16));
                v.drain(i..i + n);
            }
            // Truncate.
            4 if len > 0 => v.truncate(rng.below(len)),
            // Splice: this input's head with another seed's tail.
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            // Insert or overwrite with a dictionary token.
            6 | 7 if !dict.is_empty() => {
                let tok = &dict[rng.below(dict.len())];
                let i = rng.below(len + 1);
                if rng.below(2) == 0 || i + tok.len() > len {
                    v.splice(i..i, tok.iter().copied());
                } else {
                    v[i..i + tok.len()].copy_from_slice(tok);
                }
            }
            // Duplicate a chunk.
            8 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                let chunk = v[i..i + n].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, chunk);
            }
            // An edge value, inserted or overwriting.
            9 | 10 => {
                let tok = INTERESTING[rng.below(INTERESTING.len())];
                let i = rng.below(len + 1);
                if rng.below(2) == 0 || i + tok.len() > len {
                    v.splice(i..i, tok.iter().copied());
                } else {
                    v[i..i + tok.len()].copy_from_slice(tok);
                }
            }
            // Change an ASCII digit (lengths, versions, numbers in text).
            _ => {
                let digits: Vec<usize> =
                    v.iter().enumerate().filter(|(_, b)| b.is_ascii_digit()).map(|(i, _)| i).collect();
                if !digits.is_empty() {
                    let i = digits[rng.below(digits.len())];
                    v[i] = b'0' + rng.below(10) as u8;
                }
            }
        }
    }
    v.truncate(MAX_LEN);
    v
}

// ---------------------------------------------------------------------------------------------------
// Seed corpora.

/// Writes `fuzz/seeds/<target>/` for the targets whose seeds are generated (all but `query_parse`,
/// whose seeds are the queries of the query corpus): real SAS tokens, MQTT streams as the Azure device
/// SDKs send them, REST requests as the service SDKs send them, inter-node bodies.
#[test]
#[ignore = "regenerates the committed seed corpora"]
fn write_seeds() {
    let root = manifest_dir().join("fuzz/seeds");
    for (target, files) in [
        ("sas_token", seeds::sas_tokens()),
        ("mqtt_packets", seeds::mqtt()),
        ("http_request", seeds::http()),
        ("twin_json", seeds::twin_json()),
        ("cluster_wire", seeds::cluster()),
    ] {
        let dir = root.join(target);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the seed directory");
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).expect("write a seed");
        }
    }
}

mod seeds {
    use twinhub::fuzzing::{device_token, policy_token, HOST, NOW_SECS};

    /// Expiry of seed tokens: a year after the fixed "now".
    const SE: i64 = NOW_SECS + 365 * 24 * 3600;
    const HUB: &str = "fuzzhub.azure-devices.net";

    fn enc(s: &str) -> String {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    }

    pub fn sas_tokens() -> Vec<(&'static str, Vec<u8>)> {
        let device = device_token(&enc(&format!("{HUB}/devices/d1")), SE).expect("device token");
        let module = device_token(&enc(&format!("{HUB}/devices/d1/modules/m1")), SE).expect("module token");
        let service = policy_token("service", &enc(HOST), SE).expect("service token");
        let owner = policy_token("iothubowner", HUB, SE).expect("owner token");
        let read = policy_token("registryRead", &enc(&format!("{HUB}/devices/d1")), SE).expect("read token");
        // The Node SDK puts skn before se.
        let node_order = {
            let t = policy_token("registryReadWrite", &enc(HUB), SE).expect("token");
            let (head, rest) = t.split_once("&se=").expect("se");
            let (se, skn) = rest.split_once("&skn=").expect("skn");
            format!("{head}&skn={skn}&se={se}")
        };
        let expired = policy_token("service", &enc(HUB), NOW_SECS - 60).expect("expired");
        vec![
            ("device", device.into_bytes()),
            ("module", module.into_bytes()),
            ("service", service.into_bytes()),
            ("owner_unencoded_sr", owner.into_bytes()),
            ("registry_read_device", read.into_bytes()),
            ("node_field_order", node_order.into_bytes()),
            ("expired", expired.into_bytes()),
            ("bad", b"SharedAccessSignature sr=a&sig=%ZZ&se=x&se=2".to_vec()),
        ]
    }

    // -- MQTT: raw packets, as a client writes them.

    fn varint(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let mut b = (n % 128) as u8;
            n /= 128;
            if n > 0 {
                b |= 0x80;
            }
            out.push(b);
            if n == 0 {
                break;
            }
        }
    }

    fn s(text: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(&(text.len() as u16).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }

    fn packet(header: u8, body: Vec<u8>) -> Vec<u8> {
        let mut out = vec![header];
        varint(body.len(), &mut out);
        out.extend(body);
        out
    }

    /// CONNECT with user name and password; `v5` adds empty properties (and a session expiry).
    fn connect(v5: bool, client_id: &str, username: &str, password: &str, clean: bool, keep_alive: u16) -> Vec<u8> {
        let mut b = Vec::new();
        s("MQTT", &mut b);
        b.push(if v5 { 5 } else { 4 });
        b.push(0b1100_0000 | if clean { 0b10 } else { 0 });
        b.extend_from_slice(&keep_alive.to_be_bytes());
        if v5 {
            // Properties: session expiry interval (0x11) 3600, receive maximum (0x21) 10.
            b.extend_from_slice(&[8, 0x11, 0, 0, 0x0e, 0x10, 0x21, 0, 10]);
        }
        s(client_id, &mut b);
        s(username, &mut b);
        s(password, &mut b);
        packet(0x10, b)
    }

    fn subscribe(v5: bool, pkid: u16, filters: &[(&str, u8)]) -> Vec<u8> {
        let mut b = pkid.to_be_bytes().to_vec();
        if v5 {
            b.push(0);
        }
        for (f, qos) in filters {
            s(f, &mut b);
            b.push(*qos);
        }
        packet(0x82, b)
    }

    fn unsubscribe(v5: bool, pkid: u16, filters: &[&str]) -> Vec<u8> {
        let mut b = pkid.to_be_bytes().to_vec();
        if v5 {
            b.push(0);
        }
        for f in filters {
            s(f, &mut b);
        }
        packet(0xa2, b)
    }

    fn publish(v5: bool, qos: u8, pkid: u16, topic: &str, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        s(topic, &mut b);
        if qos > 0 {
            b.extend_from_slice(&pkid.to_be_bytes());
        }
        if v5 {
            b.push(0);
        }
        b.extend_from_slice(payload);
        packet(0x30 | (qos << 1), b)
    }

    fn puback(pkid: u16) -> Vec<u8> {
        packet(0x40, pkid.to_be_bytes().to_vec())
    }

    /// A device session as the Python device SDK (azure-iot-device 2.x, MQTT 3.1.1) runs it: CONNECT
    /// with its user name, twin response and desired subscriptions, GET, a reported patch, a
    /// telemetry message, PUBACK of a desired push, PINGREQ, UNSUBSCRIBE, DISCONNECT.
    fn session(v5: bool, client_id: &str, username: &str, password: &str) -> Vec<u8> {
        let mut out = connect(v5, client_id, username, password, false, 60);
        out.extend(subscribe(v5, 1, &[("$iothub/twin/res/#", 0), ("$iothub/twin/PATCH/properties/desired/#", 1)]));
        out.extend(publish(v5, 0, 0, "$iothub/twin/GET/?$rid=8e2b0a6c-6f0b-4d8a-9c53-1f0e7a6b2a11", b" "));
        out.extend(publish(
            v5,
            1,
            2,
            "$iothub/twin/PATCH/properties/reported/?$rid=7a1c2b3d&$version=4",
            br#"{"firmware":{"version":"1.2.3","status":"ok"},"batteryLevel":87,"nested":{"a":[1,2,{"b":null}]}}"#,
        ));
        let telemetry = if client_id.contains('/') {
            "devices/d1/modules/m1/messages/events/%24.ct=application%2Fjson&%24.ce=utf-8"
        } else {
            "devices/d1/messages/events/%24.ct=application%2Fjson&%24.ce=utf-8"
        };
        out.extend(publish(v5, 1, 3, telemetry, br#"{"temperature":21.5}"#));
        out.extend(puback(1));
        out.extend(packet(0xc0, Vec::new()));
        out.extend(unsubscribe(v5, 4, &["$iothub/twin/PATCH/properties/desired/#"]));
        out.extend(packet(0xe0, Vec::new()));
        out
    }

    pub fn mqtt() -> Vec<(&'static str, Vec<u8>)> {
        let device = device_token(&enc(&format!("{HUB}/devices/d1")), SE).expect("device token");
        let module = device_token(&enc(&format!("{HUB}/devices/d1/modules/m1")), SE).expect("module token");
        let python = format!("{HUB}/d1/?api-version=2021-04-12&DeviceClientType=azure-iot-device%2F2.14.0");
        let csharp = format!(
            "{HUB}/d1/?api-version=2021-04-12&DeviceClientType=Microsoft.Azure.Devices.Client%2F1.42.0%20%28.NET%29"
        );
        let node = format!("{HUB}/d1/m1/?api-version=2021-04-12&DeviceClientType=azure-iot-device%2F1.18.0%20%28node%29&model-id=dtmi%3Acom%3Aexample%3AThermostat%3B1");
        let mut get_only = connect(false, "d1", &format!("{HUB}/d1/"), &device, true, 240);
        get_only.extend(publish(false, 1, 9, "$iothub/twin/GET/?$rid=1", b""));
        let mut bad_query = connect(false, "d1", &python, &device, true, 60);
        bad_query.extend(publish(false, 0, 0, "$iothub/twin/PATCH/properties/reported/?$version=3&$rid=5", b"{}"));
        bad_query.extend(publish(false, 0, 0, "$iothub/twin/GET/?", b""));
        vec![
            ("python_v4", session(false, "d1", &python, &device)),
            ("csharp_v4", session(false, "d1", &csharp, &device)),
            ("node_module_v4", session(false, "d1/m1", &node, &module)),
            ("v5", session(true, "d1", &python, &device)),
            ("get_only_v4", get_only),
            ("bad_queries_v4", bad_query),
            ("mqtt31", {
                let mut b = Vec::new();
                s("MQIsdp", &mut b);
                b.extend_from_slice(&[3, 0b10, 0, 60]);
                s("d1", &mut b);
                packet(0x10, b)
            }),
        ]
    }

    // -- HTTP: requests in the text shape `fuzzing::http_request` reads.

    pub fn http() -> Vec<(&'static str, Vec<u8>)> {
        let raw_service = policy_token("service", &enc(HOST), SE).expect("token");
        // A real continuation token of the `query` seed's query: first page of one row.
        let text = "SELECT deviceId, tags.location FROM devices WHERE tags.location.region = 'US' AND properties.reported.batteryLevel > 20";
        let continuation = {
            let q = twinhub::query::parse(text).expect("the seed query parses");
            let docs: Vec<serde_json::Value> = ["d1", "d2"]
                .iter()
                .map(|d| serde_json::json!({"deviceId": d, "tags": {"location": {"region": "US"}}, "properties": {"reported": {"batteryLevel": 50}}}))
                .collect();
            let page = q.page(vec![q.shard_rows(docs.iter(), None, 1)], None, 1);
            page.next.expect("a second page").encode()
        };
        let reqs: Vec<(&str, String)> = vec![
            ("get_twin", "GET /twins/d1?api-version=2021-04-12\nauthorization: $service\n\n".into()),
            (
                "patch_twin",
                "PATCH /twins/d1?api-version=2021-04-12\nauthorization: $service\ncontent-type: application/json; charset=utf-8\nif-match: \"AAAAAAAAAAE=\"\n\n{\"tags\":{\"location\":{\"region\":\"US\"}},\"properties\":{\"desired\":{\"telemetryConfig\":{\"sendFrequencyInSecs\":300}}}}".into(),
            ),
            (
                "replace_module_twin",
                "PUT /twins/d1/modules/m1?api-version=2021-04-12\nauthorization: $iothubowner\nif-match: *\n\n{\"deviceId\":\"d1\",\"moduleId\":\"m1\",\"etag\":\"AAAAAAAAAAE=\",\"tags\":{\"a\":1},\"properties\":{\"desired\":{\"x\":[1,2,3]},\"reported\":{}}}".into(),
            ),
            (
                "put_device",
                "PUT /devices/d1?api-version=2021-04-12\nauthorization: $registryReadWrite\n\n{\"deviceId\":\"d1\",\"status\":\"enabled\",\"authentication\":{\"type\":\"sas\",\"symmetricKey\":{\"primaryKey\":null,\"secondaryKey\":null}},\"capabilities\":{\"iotEdge\":false}}".into(),
            ),
            (
                "put_module",
                "PUT /devices/d1/modules/m1?api-version=2021-04-12\nauthorization: $iothubowner\nif-match: \"AAAAAAAAAAI=\"\n\n{\"deviceId\":\"d1\",\"moduleId\":\"m1\",\"authentication\":{\"type\":\"sas\",\"symmetricKey\":{\"primaryKey\":\"c2VjcmV0LWtleS1mb3ItdGVzdHMtMDEyMzQ1Njc4OQ==\",\"secondaryKey\":\"c2VjcmV0LWtleS1mb3ItdGVzdHMtMDEyMzQ1Njc4OQ==\"}}}".into(),
            ),
            (
                "bulk",
                "POST /devices?api-version=2021-04-12\nauthorization: $registryReadWrite\n\n[{\"id\":\"b1\",\"importMode\":\"create\",\"status\":\"enabled\",\"authentication\":{\"type\":\"sas\",\"symmetricKey\":{}},\"tags\":{\"building\":43,\"battery\":[1,null,{\"k\":\"v\"}]},\"properties\":{\"desired\":{\"fw\":{\"v\":\"2.0\",\"n\":1.5e3}}}},{\"id\":\"b2\",\"moduleId\":\"m\",\"importMode\":\"updateTwinIfMatchETag\",\"twinETag\":\"*\",\"tags\":{\"a\":null}},{\"id\":\"b3\",\"importMode\":\"delete\"}]".into(),
            ),
            ("delete_device", "DELETE /devices/d1?api-version=2021-04-12\nauthorization: $iothubowner\nif-match: *\n\n".into()),
            ("list_devices", "GET /devices?top=10&api-version=2021-04-12\nauthorization: $registryRead\n\n".into()),
            (
                "query",
                format!("POST /devices/query?api-version=2021-04-12\nauthorization: $registryRead\ncontent-type: application/json\nx-ms-max-item-count: 2\nx-ms-continuation: {continuation}\n\n{{\"query\":\"{text}\"}}"),
            ),
            (
                "query_aggregate",
                "POST /devices/query?api-version=2021-04-12\nauthorization: $service\n\n{\"query\":\"SELECT properties.reported.telemetryConfig.status AS status, COUNT() AS numberOfDevices FROM devices GROUP BY properties.reported.telemetryConfig.status\"}".into(),
            ),
            (
                "create_job",
                "PUT /jobs/v2/job1?api-version=2021-04-12\nauthorization: $registryReadWrite\n\n{\"jobId\":\"job1\",\"type\":\"scheduleUpdateTwin\",\"queryCondition\":\"deviceId IN ['d1','d2']\",\"updateTwin\":{\"etag\":\"*\",\"tags\":{\"floor\":2},\"properties\":{\"desired\":{\"mode\":\"eco\"}}},\"startTime\":\"2026-11-01T00:00:00Z\",\"maxExecutionTimeInSeconds\":3600}".into(),
            ),
            ("get_job", "GET /jobs/v2/job1?api-version=2021-04-12\nauthorization: $registryRead\n\n".into()),
            ("cancel_job", "POST /jobs/v2/job1/cancel?api-version=2021-04-12\nauthorization: $registryReadWrite\n\n".into()),
            ("query_jobs", "GET /jobs/v2/query?jobType=scheduleUpdateTwin&jobStatus=completed&api-version=2021-04-12\nauthorization: $registryRead\nx-ms-max-item-count: 5\n\n".into()),
            ("twin_changes", "GET /twin-changes?from=0&api-version=2021-04-12\nauthorization: $service\n\n".into()),
            ("add_member", "POST /cluster/members\nauthorization: $iothubowner\n\n{\"id\":4,\"addr\":\"10.0.0.4:7000\"}".into()),
            ("remove_member", "DELETE /cluster/members/4\nauthorization: $iothubowner\n\n".into()),
            ("stats", "GET /statistics/devices?api-version=2021-04-12\nauthorization: $registryRead\n\n".into()),
            ("health", "GET /health\n\n".into()),
            ("raw_token", format!("GET /twins/d1/modules/m1?api-version=2021-04-12\nauthorization: {raw_service}\n\n")),
            ("no_auth_body", "PATCH /twins/d1\ncontent-type: application/json\n\n{\"tags\":{}}".into()),
            ("put_configuration", r#"PUT /configurations/c1?api-version=2021-04-12\nauthorization: $registryReadWrite\nif-match: *\n\n{"id":"c1","content":{"deviceContent":{"properties.desired.fw.version":"2.0","properties.desired.fw.url":"https://example.com/fw"}},"targetCondition":"tags.site='b43'","priority":10,"labels":{"team":"a"},"metrics":{"queries":{"applied":"SELECT deviceId FROM devices WHERE properties.reported.fw.version = '2.0'"}}}"#.replace("\\n", "\n")),
            ("test_queries", r#"POST /configurations/testQueries?api-version=2021-04-12\nauthorization: $registryRead\n\n{"targetCondition":"tags.site='b43'","customMetricQueries":{"applied":"SELECT deviceId FROM devices WHERE properties.reported.fw.version = '2.0'"}}"#.replace("\\n", "\n")),
            ("put_certificate", r#"PUT /certificates/ca1?api-version=2021-04-12\nauthorization: $iothubowner\n\n{"properties":{"certificate":"MIIBezCCASGgAwIBAgIUbBCm0jLPxcKIIVZIWYbho3Me49IwCgYIKoZIzj0EAwIwEjEQMA4GA1UEAwwHZnV6ei1jYTAgFw0yNjEyMDcyMzA1NTVaGA8yMTI2MTExMzIzMDU1NVowEjEQMA4GA1UEAwwHZnV6ei1jYTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABMXiezcOogNkcWS+/Ju1Iu2Vev0HpuNFJS5LDGnbjFSIs3g1dPG2u1+sbfeOL1NMgB1O+215Pze66xHQlfyYr3CjUzBRMB0GA1UdDgQWBBTWNhs3nQlEBKfsbVJvXAInUOEZWDAfBgNVHSMEGDAWgBTWNhs3nQlEBKfsbVJvXAInUOEZWDAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIQDGqfEyTmiUdpSMCSOEQN+2FiRV8KygJMzOhrMXiMkobwIgFoCEZqvFFAmvWPxj18rxL3R6wcw6OUH7aR7friU8AKw=","isVerified":false}}"#.replace("\\n", "\n")),
            ("invoke_method", r#"POST /twins/d1/modules/m1/methods?api-version=2021-04-12\nauthorization: $service\n\n{"methodName":"reboot","payload":{"delay":5},"responseTimeoutInSeconds":30,"connectTimeoutInSeconds":10}"#.replace("\\n", "\n")),
            ("restore_meta", r#"POST /cluster/restore/meta\nauthorization: $iothubowner\n\n{"jobs":{"jobs":{}},"configs":{"configs":{},"etag_seq":1}}"#.replace("\\n", "\n")),
        ];
        reqs.into_iter().map(|(n, r)| (n, r.into_bytes())).collect()
    }

    pub fn twin_json() -> Vec<(&'static str, Vec<u8>)> {
        let v: Vec<(&str, &str)> = vec![
            (
                "patch",
                r#"{"tags":{"location":{"region":"US","plant":"Redmond43"}},"properties":{"desired":{"telemetryConfig":{"sendFrequencyInSecs":300}}}}"#,
            ),
            (
                "sdk_twin",
                r#"{"deviceId":"d1","etag":"AAAAAAAAAAE=","version":3,"status":"enabled","tags":{"a":null},"properties":{"desired":{"$version":2,"x":1.5e3},"reported":{}}}"#,
            ),
            (
                "reported",
                r#"{"firmware":{"version":"1.2.3"},"batteryLevel":87,"list":[1,"two",{"three":3}],"gone":null}"#,
            ),
            (
                "deep",
                r#"{"tags":{"one":{"two":{"three":{"four":{"five":{"six":{"seven":{"eight":{"nine":{"ten":{"property":1}}}}}}}}}}}}"#,
            ),
            (
                "bad_keys",
                r#"{"tags":{"a.b":1,"$c":2," d":3,"e\u0000":4},"properties":{"desired":{"big":4503599627370496}}}"#,
            ),
            ("unicode", "{\"tags\":{\"caf\u{e9}\":\"\u{1f600}\\ud83d\\ude00\"}}"),
            (
                "configuration",
                r#"{"id":"c1","content":{"deviceContent":{"properties.desired.fw.version":"2.0","properties.desired.fw.url":"https://example.com/fw"}},"targetCondition":"tags.site='b43'","priority":10,"labels":{"team":"a"},"metrics":{"queries":{"applied":"SELECT deviceId FROM devices WHERE properties.reported.fw.version = '2.0'"}}}"#,
            ),
            (
                "method",
                r#"{"methodName":"reboot","payload":{"delay":5},"responseTimeoutInSeconds":30,"connectTimeoutInSeconds":10}"#,
            ),
        ];
        v.into_iter().map(|(n, t)| (n, t.as_bytes().to_vec())).collect()
    }

    // -- Cluster: postcard bodies as members send them, and signature-header blocks.

    pub fn cluster() -> Vec<(&'static str, Vec<u8>)> {
        use openraft::raft::VoteRequest;
        use twinhub::cluster::transport::wire::{self, RpcFailure, ShardRequest};
        use twinhub::model::{Command, Op, RequestId};
        use twinhub::shard::types::TypeConfig;
        use twinhub::TwinId;

        let vote = VoteRequest::<TypeConfig>::new(openraft::impls::Vote::new(5, 2), None);
        let cmd = Command {
            request_id: RequestId::random(),
            timestamp_ms: NOW_SECS * 1000,
            op: Op::UpdateReported { id: TwinId::device("d1"), patch_json: r#"{"a":1}"#.into() },
        };
        let body = wire::encode(&ShardRequest { shard: 3, rpc: vote }).expect("encode");
        // A heartbeat-plus-one-entry append from leader (term 5, node 2).
        use openraft::vote::RaftLeaderId;
        let log_id =
            |index| twinhub::shard::types::LogId::new(openraft::impls::leader_id_adv::LeaderId::new(5u64, 2u64), index);
        let entry = twinhub::shard::types::Entry {
            log_id: log_id(10),
            payload: openraft::EntryPayload::Normal(std::sync::Arc::new(cmd.clone())),
        };
        let append = openraft::raft::AppendEntriesRequest::<TypeConfig> {
            vote: openraft::impls::Vote::new_committed(5, 2),
            prev_log_id: Some(log_id(9)),
            entries: vec![entry],
            leader_commit: Some(log_id(9)),
        };
        let append = wire::encode(&ShardRequest { shard: 1, rpc: append }).expect("encode");
        // The signature header of a vote from node 2, valid for the fuzz target's secret and clock,
        // then the body: mutations start past the MAC.
        use twinhub::cluster::transport::auth::{self, BodyDigest, ClusterSecret, Direction, Envelope, Nonce};
        let envelope = Envelope {
            direction: Direction::Request { method: "POST" },
            path: "/cluster/v5/raft/append",
            node: 2,
            ts: NOW_SECS as u64 * 1000,
            nonce: Nonce([0x5a; 16]),
            body: BodyDigest::of(&body),
        };
        let mut signed = hyper::HeaderMap::new();
        ClusterSecret::new(b"fuzz cluster secret").expect("secret").sign_headers(&mut signed, &envelope);
        let mut headers = signed.get(auth::HEADER_AUTH).expect("signed").as_bytes().to_vec();
        headers.push(b'\n');
        headers.extend_from_slice(&body);
        let batch = wire::encode_append_batch(37, &[&append, &body]).expect("encode");
        let batch_answer: Vec<Result<bytes::Bytes, RpcFailure>> =
            vec![Ok(bytes::Bytes::from_static(b"\x01\x05")), Err(RpcFailure::Unfinished { waited_ms: 37 })];
        vec![
            ("vote", body.clone()),
            ("append_batch", batch),
            ("append_batch_answer", wire::encode(&batch_answer).expect("encode")),
            ("append", append),
            ("failure_unknown_shard", wire::encode(&RpcFailure::UnknownShard(4)).expect("encode")),
            (
                "failure_group_stopped",
                wire::encode(&RpcFailure::GroupStopped { shard: 1, msg: "storage".into() }).expect("encode"),
            ),
            ("forwarded_write", postcard::to_allocvec(&(TwinId::module("d1", "m1"), cmd.clone())).expect("encode")),
            ("map_write_json", serde_json::to_vec(&cmd).expect("encode")),
            ("event_tail", postcard::to_allocvec(&(2u32, Some(17u64))).expect("encode")),
            ("join_json", br#"[4,"10.0.0.4:7000",8]"#.to_vec()),
            ("endpoint", b"/cluster/v5/call/twin.write".to_vec()),
            ("signed_vote", headers),
        ]
    }
}

/// The seeds are worth mutating only if they get past the front door: requests with a `$policy`
/// token are not refused as unauthenticated, and the rest answer as the route tests say.
#[test]
fn http_seeds_get_past_authentication() {
    let dir = manifest_dir().join("fuzz/seeds/http_request");
    for (name, want) in [
        ("patch_twin", 500), // validated, then "twin layer not running"
        ("get_twin", 500),
        ("query", 500),
        ("create_job", 500),
        ("bulk", 500), // every entry parsed first
        ("put_configuration", 500),
        ("test_queries", 200),
        ("put_certificate", 500), // the certificate read and described first
        ("invoke_method", 500),   // the call parsed, then "direct methods are not running"
        ("restore_meta", 500),
        ("health", 200),
        ("no_auth_body", 401),
    ] {
        let input = std::fs::read(dir.join(name)).expect("seed");
        assert_eq!(fuzzing::http_status(&input), Some(want), "{name}");
    }
}

/// The MQTT seeds authenticate and are read to their DISCONNECT, so mutants start deep in a session.
#[test]
fn mqtt_seeds_are_whole_sessions() {
    let dir = manifest_dir().join("fuzz/seeds/mqtt_packets");
    for name in ["python_v4", "csharp_v4", "node_module_v4", "v5"] {
        let input = std::fs::read(dir.join(name)).expect("seed");
        // SUBSCRIBE, GET, reported patch, telemetry, PUBACK, PINGREQ, UNSUBSCRIBE (DISCONNECT ends it).
        assert_eq!(fuzzing::mqtt_session(&input), fuzzing::MqttRun { authenticated: true, packets: 7 }, "{name}");
    }
}

/// The driver fails on a panic the code under test lets through and on one it catches itself (as
/// the MQTT codec does around rumqttd), and passes quiet inputs.
#[test]
fn driver_sees_caught_and_uncaught_panics() {
    install_hook();
    fn quiet(_: &[u8]) {}
    fn loud(data: &[u8]) {
        assert!(data.is_empty(), "boom");
    }
    fn swallowed(data: &[u8]) {
        let _ = std::panic::catch_unwind(|| loud(data));
    }
    assert_eq!(check(quiet, b"x"), None);
    assert!(check(loud, b"x").is_some_and(|m| m.contains("boom")));
    assert!(check(swallowed, b"x").is_some_and(|m| m.contains("boom")));
    assert_eq!(check(swallowed, b""), None);
}
