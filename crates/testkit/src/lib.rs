//! twinhub's test kit, shared by the integration tests, the benches and the companions' tests: starts
//! the real `twinhub` binary on a temporary data directory, reads the connection string it prints, and talks to it over HTTPS with reqwest (rustls,
//! trusting only the development CA the server generated).
//!
//! Nothing here is a mock: every request goes through TLS, SAS auth and the real server.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

pub const API_VERSION: &str = "2021-04-12";
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// How to start a server.
#[derive(Clone, Debug, Default)]
pub struct ServerOpts {
    /// `--owner-key`; `None` lets the server generate one.
    pub owner_key: Option<String>,
    /// `--shard-count`.
    pub shard_count: Option<u32>,
    /// Extra command-line arguments after `serve`.
    pub extra_args: Vec<String>,
    /// Extra environment variables for the child (e.g. `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// The binary to run; default: the `twinhub` binary cargo built for this test or bench.
    pub bin: Option<PathBuf>,
    /// Soft and hard `RLIMIT_NOFILE` for the child (default: inherited).
    pub nofile: Option<u64>,
}

/// A running `twinhub serve` child process on its own temporary data directory.
pub struct Server {
    opts: ServerOpts,
    _root: tempfile::TempDir,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
    /// `HostName` of the printed connection string, e.g. `localhost:40123`.
    pub host_name: String,
    pub port: u16,
    /// `https://localhost:PORT`.
    pub base_url: String,
    pub owner_key: String,
    pub connection_string: String,
    pub ca_pem: Vec<u8>,
    /// Bound MQTT-over-TLS port (`DIR/listen.json`).
    pub mqtt_port: u16,
    /// Bound plain-TCP MQTT port (tests always enable it).
    pub mqtt_plain_port: u16,
    /// Bound event-broker port.
    pub events_port: u16,
}

/// The `twinhub` binary of this Cargo build. Tests and benches run from `target/<profile>/deps/`, and
/// Cargo builds the package's programs into `target/<profile>/` before it runs them.
pub fn bin_path() -> PathBuf {
    companion("twinhub")
}

/// The program `name` of this Cargo build (`twinhub`, `twinhub-chaos`, `twinhub-bench`): beside the
/// running executable, or one level up from `deps/`. Panics with the command that builds it.
pub fn companion(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let mut dir = exe.parent().expect("the test's directory").to_path_buf();
    if dir.file_name().is_some_and(|d| d == "deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(path.is_file(), "{} is missing: build it first (cargo build -p {name})", path.display());
    path
}

/// `--mqtt-listen` is part of the interface (MQTT itself is a later issue); pass it only if the binary
/// knows it, so that parallel servers never fight over the default port 8883.
fn mqtt_flag_supported(bin: &Path) -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        Command::new(bin)
            .args(["serve", "--help"])
            .stdin(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("--mqtt-listen"))
            .unwrap_or(false)
    })
}

impl Server {
    pub fn start(opts: ServerOpts) -> Server {
        let root = tempfile::Builder::new().prefix("twinhub-test-").tempdir().expect("create temp dir");
        let data_dir = root.path().join("data");
        let log_path = root.path().join("server.log");
        let mut s = Server {
            opts,
            data_dir,
            log_path,
            _root: root,
            child: None,
            host_name: String::new(),
            port: 0,
            base_url: String::new(),
            owner_key: String::new(),
            connection_string: String::new(),
            ca_pem: Vec::new(),
            mqtt_port: 0,
            mqtt_plain_port: 0,
            events_port: 0,
        };
        s.spawn();
        s
    }

    pub fn start_default() -> Server {
        Server::start(ServerOpts::default())
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "spawn while a child is running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path).expect("open server log");
        let bin = self.opts.bin.clone().unwrap_or_else(bin_path);
        let mut cmd = Command::new(&bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--http-listen")
            .arg("127.0.0.1:0")
            .arg("--hostname")
            .arg("localhost");
        if let Some(k) = &self.opts.owner_key {
            cmd.arg("--owner-key").arg(k);
        }
        if let Some(n) = self.opts.shard_count {
            cmd.arg("--shard-count").arg(n.to_string());
        }
        // Unless a test asks for fixed ports, keep every listener on an ephemeral loopback port so that
        // parallel servers never collide. (An older binary given with `bin` may not know the flags.)
        if mqtt_flag_supported(&bin) {
            let fixed = |flag: &str| self.opts.extra_args.iter().any(|a| a == flag);
            for flag in ["--mqtt-listen", "--mqtt-plain-listen", "--events-listen"] {
                if !fixed(flag) {
                    cmd.arg(flag).arg("127.0.0.1:0");
                }
            }
        }
        cmd.args(&self.opts.extra_args);
        // Never inherit a developer's TWINHUB_* settings.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TWINHUB_") {
                cmd.env_remove(&k);
            }
        }
        cmd.env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .env("NO_COLOR", "1");
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        if let Some(n) = self.opts.nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(log));
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot spawn {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            // Forward the first connection-string line, keep draining the rest so the child never
            // blocks on a full pipe.
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent && line.trim_start().starts_with("HostName=") {
                    let _ = tx.send(line.trim().to_string());
                    sent = true;
                } else {
                    eprintln!("[twinhub stdout] {line}");
                }
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let line = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => break line,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "twinhub exited ({status}) before printing its connection string\n--- stderr ---\n{}",
                    self.stderr_tail()
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "twinhub did not print its connection string within {START_TIMEOUT:?}\n--- stderr ---\n{}",
                    self.stderr_tail()
                );
            }
        };
        self.child = Some(child);
        let cs = parse_connection_string(&line);
        let host_name = cs.get("HostName").cloned().unwrap_or_else(|| {
            panic!("connection string without HostName: {line}");
        });
        assert_eq!(
            cs.get("SharedAccessKeyName").map(String::as_str),
            Some("iothubowner"),
            "connection string must name iothubowner: {line}"
        );
        let key = cs
            .get("SharedAccessKey")
            .cloned()
            .unwrap_or_else(|| panic!("connection string without SharedAccessKey: {line}"));
        B64.decode(&key).unwrap_or_else(|e| panic!("owner key is not base64 ({e}): {key}"));
        let port: u16 = host_name
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("HostName must carry the bound port: {host_name}"));
        assert_ne!(port, 0, "printed port must be the bound one");
        if let Some(k) = &self.opts.owner_key {
            assert_eq!(&key, k, "printed owner key must be the one given with --owner-key");
        }
        let ca_path = self.data_dir.join("tls").join("ca.pem");
        let ca_pem =
            std::fs::read(&ca_path).unwrap_or_else(|e| panic!("cannot read generated CA {}: {e}", ca_path.display()));
        if let Ok(text) = std::fs::read_to_string(self.data_dir.join("listen.json")) {
            let v: Value = serde_json::from_str(&text).expect("listen.json is JSON");
            let port_of =
                |k: &str| v[k].as_str().and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| p.parse().ok()).unwrap_or(0);
            self.mqtt_port = port_of("mqtt");
            self.mqtt_plain_port = port_of("mqtt_plain");
            self.events_port = port_of("events");
        }
        self.host_name = host_name;
        self.port = port;
        self.base_url = format!("https://localhost:{port}");
        self.owner_key = key;
        self.connection_string = line;
        self.ca_pem = ca_pem;
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server not running").id()
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (up to 30 s) for the exit; returns the exit status.
    pub fn sigterm(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("server not running");
        let ok = Command::new("kill").args(["-TERM", &c.id().to_string()]).status().expect("run kill -TERM");
        assert!(ok.success(), "kill -TERM failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.try_wait().expect("wait child") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("twinhub did not exit within 30 s of SIGTERM\n--- stderr ---\n{}", self.stderr_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server again on the same data directory (after `kill9` or `sigterm`).
    pub fn restart(&mut self) {
        if self.child.is_some() {
            self.kill9();
        }
        self.spawn();
    }

    /// Starts the server again on the same data directory with other options (an operator who
    /// changed the command line between two starts).
    pub fn restart_with(&mut self, opts: ServerOpts) {
        self.opts = opts;
        self.restart();
    }

    /// The last 8 KB of the server's stderr (all runs of this data directory).
    pub fn stderr_tail(&self) -> String {
        let s = std::fs::read(&self.log_path).unwrap_or_default();
        let s = String::from_utf8_lossy(&s);
        let start = s.len().saturating_sub(8192);
        let start = (start..s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(s.len());
        s[start..].to_string()
    }

    /// The server's log reports no panic.
    pub fn assert_no_panics_in_log(&self) {
        let log = String::from_utf8_lossy(&std::fs::read(&self.log_path).unwrap_or_default()).to_string();
        if let Some(line) = log.lines().find(|l| l.contains("panicked")) {
            panic!("the server panicked: {line}\n{}", self.stderr_tail());
        }
    }

    /// A client authenticated as iothubowner.
    pub fn owner(&self) -> Api {
        self.api("iothubowner", &self.owner_key.clone())
    }

    /// A client authenticated as `policy` with `key`.
    pub fn api(&self, policy: &str, key: &str) -> Api {
        Api {
            http: self.http_client(),
            base_url: self.base_url.clone(),
            host_name: self.host_name.clone(),
            auth: Auth::Policy { name: policy.to_string(), key: key.to_string() },
        }
    }

    /// A client sending exactly this Authorization header (or none).
    pub fn api_raw_auth(&self, header: Option<&str>) -> Api {
        Api {
            http: self.http_client(),
            base_url: self.base_url.clone(),
            host_name: self.host_name.clone(),
            auth: match header {
                Some(h) => Auth::Raw(h.to_string()),
                None => Auth::None,
            },
        }
    }

    pub fn http_client(&self) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(&self.ca_pem).expect("parse generated CA");
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .https_only(true)
            .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], self.port)))
            .timeout(Duration::from_secs(60))
            .build()
            .expect("build reqwest client")
    }

    /// The key of a non-owner policy (`service`, `registryRead`, `registryReadWrite`) from
    /// `DIR/policies.json`.
    pub fn policy_key(&self, policy: &str) -> String {
        let path = self.data_dir.join("policies.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", path.display()));
        find_policy_key(&v, policy)
            .unwrap_or_else(|| panic!("no key for policy {policy} in {}: {text}", path.display()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- twinhub stderr (tail) ---\n{}", self.stderr_tail());
        }
    }
}

/// Looks for a policy's primary key in the shapes a policies file plausibly has:
/// `{"name": {"primaryKey"|"key"|...}}`, `{"name": "key"}`, `[{"keyName"|"name": .., "primaryKey"|"key": ..}]`,
/// or any of those under a top-level `"policies"` member.
fn find_policy_key(v: &Value, policy: &str) -> Option<String> {
    const KEY_FIELDS: [&str; 4] = ["primaryKey", "primary_key", "key", "sharedAccessKey"];
    const NAME_FIELDS: [&str; 3] = ["keyName", "name", "key_name"];
    let from_obj = |o: &Value| -> Option<String> {
        match o {
            Value::String(s) => Some(s.clone()),
            Value::Object(m) => KEY_FIELDS.iter().find_map(|f| m.get(*f).and_then(Value::as_str).map(str::to_string)),
            _ => None,
        }
    };
    match v {
        Value::Object(m) => {
            if let Some(p) = m.get("policies") {
                if let Some(k) = find_policy_key(p, policy) {
                    return Some(k);
                }
            }
            m.iter().find(|(k, _)| k.eq_ignore_ascii_case(policy)).and_then(|(_, o)| from_obj(o))
        }
        Value::Array(a) => a.iter().find_map(|o| {
            let name = NAME_FIELDS.iter().find_map(|f| o.get(*f).and_then(Value::as_str))?;
            if name.eq_ignore_ascii_case(policy) {
                from_obj(o)
            } else {
                None
            }
        }),
        _ => None,
    }
}

pub fn parse_connection_string(s: &str) -> std::collections::HashMap<String, String> {
    s.split(';').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

// ---------------------------------------------------------------------------------------------------
// SAS tokens (docs/iothub-protocol.md §1.3)

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

/// Python's `urllib.parse.quote_plus(s)` (safe=''): spaces become `+`.
pub fn py_quote_plus(s: &str) -> String {
    s.split(' ').map(|p| py_quote(p, "")).collect::<Vec<_>>().join("+")
}

/// JSON that nests without bound through serde_json's private raw-value key: `levels` levels of 125
/// arrays around an object whose one key is that key, over the escaped text of the level below. A
/// reader that follows the key (serde_json's `Value`) parses each level with a fresh nesting limit on
/// the same stack; 120 levels (about 100 KiB) are 15,000 nestings deep.
pub fn nested_raw_values(levels: usize) -> String {
    let mut t = "0".to_string();
    for _ in 0..levels {
        let escaped = t.replace('\\', "\\u005c").replace('"', "\\u0022");
        t = format!("{}{{\"$serde_json::private::RawValue\":\"{escaped}\"}}{}", "[".repeat(125), "]".repeat(125));
    }
    t
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// base64(HMAC-SHA256(base64decode(key), msg)).
pub fn sign(key_b64: &str, msg: &str) -> String {
    let key = B64.decode(key_b64).expect("SAS key must be base64");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("hmac key");
    mac.update(msg.as_bytes());
    B64.encode(mac.finalize().into_bytes())
}

/// A service (policy) token exactly as `azure-iot-hub` builds it: `sr = quote_plus(HostName)`,
/// `sig = quote(base64(hmac(sr + "\n" + se)))` (with `/` left as is), `se`, `skn`.
pub fn service_sas(host_name: &str, policy: &str, key_b64: &str, expiry_unix: u64) -> String {
    let sr = py_quote_plus(host_name);
    let sig = sign(key_b64, &format!("{sr}\n{expiry_unix}"));
    format!("SharedAccessSignature sr={sr}&sig={}&se={expiry_unix}&skn={policy}", py_quote(&sig, "/"))
}

/// A device or module token as the device SDKs build it: `sr = quote({host}/devices/{id}[/modules/{mid}])`,
/// no `skn`. Written here from the spec, not with twinhub's own signer, so the tests check the server
/// against an independent implementation.
pub fn device_token(host: &str, device: &str, module: Option<&str>, key: &str, expiry: u64) -> String {
    let resource = match module {
        Some(m) => format!("{host}/devices/{device}/modules/{m}"),
        None => format!("{host}/devices/{device}"),
    };
    let sr = py_quote(&resource, "");
    let sig = sign(key, &format!("{sr}\n{expiry}"));
    format!("SharedAccessSignature sr={sr}&sig={}&se={expiry}", py_quote(&sig, ""))
}

// ---------------------------------------------------------------------------------------------------
// REST client

#[derive(Clone, Debug)]
pub enum Auth {
    Policy { name: String, key: String },
    Raw(String),
    None,
}

#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base_url: String,
    pub host_name: String,
    pub auth: Auth,
}

/// A response, with its body parsed as JSON when it is JSON.
#[derive(Debug, Clone)]
pub struct Resp {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub content_type: String,
    pub text: String,
    pub json: Option<Value>,
    /// Response headers, names in lower case.
    pub headers: std::collections::HashMap<String, String>,
}

impl Resp {
    pub fn json(&self) -> &Value {
        self.json.as_ref().unwrap_or_else(|| panic!("{} {}: body is not JSON: {:?}", self.method, self.path, self.text))
    }

    /// `ErrorCode:<Code>` from IoT Hub's error body `{"Message":"ErrorCode:<Code>;…"}`.
    pub fn error_code(&self) -> String {
        let msg =
            self.json().get("Message").and_then(Value::as_str).unwrap_or_else(|| {
                panic!("{} {}: error body without \"Message\": {}", self.method, self.path, self.text)
            });
        let rest = msg
            .strip_prefix("ErrorCode:")
            .unwrap_or_else(|| panic!("{} {}: Message does not start with ErrorCode: {msg}", self.method, self.path));
        rest.split(';').next().unwrap_or("").to_string()
    }

    pub fn message(&self) -> String {
        self.json().get("Message").and_then(Value::as_str).unwrap_or("").to_string()
    }
}

/// One header for a request.
pub type Hdr<'a> = (&'a str, &'a str);

impl Api {
    pub fn url(&self, path: &str) -> String {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}{}{}api-version={}", self.base_url, path, sep, API_VERSION)
    }

    pub fn auth_header(&self) -> Option<String> {
        match &self.auth {
            Auth::Policy { name, key } => Some(service_sas(&self.host_name, name, key, unix_now() + 3600)),
            Auth::Raw(h) => Some(h.clone()),
            Auth::None => None,
        }
    }

    /// Sends a request; `body` is sent as JSON when `Some`.
    pub async fn send(&self, method: &str, path: &str, body: Option<&Value>, headers: &[Hdr<'_>]) -> Resp {
        let raw = body.map(|b| serde_json::to_vec(b).unwrap());
        self.send_raw(method, path, raw, headers).await
    }

    /// Sends raw bytes as an `application/json` body.
    pub async fn send_raw(&self, method: &str, path: &str, body: Option<Vec<u8>>, headers: &[Hdr<'_>]) -> Resp {
        match self.try_send_raw(method, path, body, headers).await {
            Ok(r) => r,
            Err(e) => panic!("{method} {path}: transport error: {e:?}"),
        }
    }

    /// Like `send_raw`, but a transport failure (connection refused, reset) is returned, not a panic.
    pub async fn try_send_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[Hdr<'_>],
    ) -> Result<Resp, reqwest::Error> {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut rb = self.http.request(m, self.url(path));
        if let Some(h) = self.auth_header() {
            rb = rb.header("Authorization", h);
        }
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if let Some(b) = body {
            rb = rb.header("Content-Type", "application/json").body(b);
        }
        let r = rb.send().await?;
        let status = r.status().as_u16();
        let content_type = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let headers = r
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_ascii_lowercase(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let text = r.text().await?;
        let json = serde_json::from_str(&text).ok();
        Ok(Resp { method: method.into(), path: path.into(), status, content_type, text, json, headers })
    }

    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[Hdr<'_>],
    ) -> Result<Resp, reqwest::Error> {
        let raw = body.map(|b| serde_json::to_vec(b).unwrap());
        self.try_send_raw(method, path, raw, headers).await
    }

    /// Sends and asserts the status; returns the response.
    pub async fn must(&self, status: u16, method: &str, path: &str, body: Option<&Value>, headers: &[Hdr<'_>]) -> Resp {
        let r = self.send(method, path, body, headers).await;
        assert_eq!(r.status, status, "{method} {path}: expected {status}, got {} with body {}", r.status, r.text);
        if (200..300).contains(&status) && !r.text.is_empty() {
            assert!(
                r.content_type.contains("application/json"),
                "{method} {path}: JSON response must say application/json, got {:?}",
                r.content_type
            );
        }
        r
    }

    /// Asserts a 200 with a JSON body and returns the body.
    pub async fn must_ok(&self, method: &str, path: &str, body: Option<&Value>, headers: &[Hdr<'_>]) -> Value {
        self.must(200, method, path, body, headers).await.json().clone()
    }

    /// Asserts an error response: exact status, IoT Hub error body and error code.
    pub async fn must_err(
        &self,
        status: u16,
        code: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[Hdr<'_>],
    ) -> Resp {
        let r = self.send(method, path, body, headers).await;
        assert_error(&r, status, code);
        r
    }

    // Shorthands.

    pub async fn must_get(&self, path: &str) -> Value {
        self.must_ok("GET", path, None, &[]).await
    }

    /// Creates a device with generated keys; returns the Device document.
    pub async fn must_create_device(&self, id: &str) -> Value {
        let body = json!({"deviceId": id, "status": "enabled",
                          "authentication": {"type": "sas", "symmetricKey": {}}});
        self.must_ok("PUT", &format!("/devices/{}", enc(id)), Some(&body), &[]).await
    }

    /// Creates a module with generated keys; returns the Module document. IoT Hub answers module
    /// creation with 200 or 201 (docs/iothub-protocol.md §3.1), both accepted here.
    pub async fn must_create_module(&self, dev: &str, module: &str) -> Value {
        let body = json!({"deviceId": dev, "moduleId": module,
                          "authentication": {"type": "sas", "symmetricKey": {}}});
        let path = format!("/devices/{}/modules/{}", enc(dev), enc(module));
        let r = self.send("PUT", &path, Some(&body), &[]).await;
        assert!(
            r.status == 200 || r.status == 201,
            "PUT {path}: expected 200/201, got {} with body {}",
            r.status,
            r.text
        );
        r.json().clone()
    }

    pub async fn must_get_twin(&self, id: &str) -> Value {
        self.must_get(&format!("/twins/{}", enc(id))).await
    }

    pub async fn must_patch_twin(&self, id: &str, patch: &Value) -> Value {
        self.must_ok("PATCH", &format!("/twins/{}", enc(id)), Some(patch), &[]).await
    }
}

pub fn assert_error(r: &Resp, status: u16, code: &str) {
    assert_eq!(
        r.status, status,
        "{} {}: expected {status} {code}, got {} with body {}",
        r.method, r.path, r.status, r.text
    );
    assert!(r.json.is_some(), "{} {}: error body must be JSON, got {:?}", r.method, r.path, r.text);
    let got = r.error_code();
    assert_eq!(got, code, "{} {}: wrong error code; body {}", r.method, r.path, r.text);
}

/// Percent-encodes a path segment (like Node's `encodeURIComponent`).
pub fn enc(s: &str) -> String {
    py_quote(s, "!'()*")
}

/// `If-Match` value for an etag: `"etag"`.
pub fn quoted(etag: &str) -> String {
    format!("\"{etag}\"")
}

/// The etag member of a document, asserting it is a non-empty string and not `*`.
pub fn etag_of(doc: &Value) -> String {
    let e = doc.get("etag").and_then(Value::as_str).unwrap_or_else(|| panic!("document without a string etag: {doc}"));
    assert!(!e.is_empty() && e != "*", "bad etag {e:?} in {doc}");
    e.to_string()
}

pub fn desired_version(twin: &Value) -> i64 {
    twin.pointer("/properties/desired/$version")
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("twin without properties.desired.$version: {twin}"))
}

pub fn reported_version(twin: &Value) -> i64 {
    twin.pointer("/properties/reported/$version")
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("twin without properties.reported.$version: {twin}"))
}

pub fn twin_version(twin: &Value) -> i64 {
    twin.get("version").and_then(Value::as_i64).unwrap_or_else(|| panic!("twin without an integer version: {twin}"))
}

/// A copy of an object without its `$`-prefixed members (`$metadata`, `$version`).
pub fn user_props(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        Value::Null => json!({}),
        other => panic!("expected an object, got {other}"),
    }
}

/// The twin's tags, `{}` when absent or null.
pub fn tags_of(twin: &Value) -> Value {
    match twin.get("tags") {
        None | Some(Value::Null) => json!({}),
        Some(t) => t.clone(),
    }
}

/// The parts of a twin that a write could change: tags, properties, versions, etag.
pub fn twin_state(twin: &Value) -> Value {
    json!({
        "etag": twin.get("etag"),
        "version": twin.get("version"),
        "tags": tags_of(twin),
        "properties": twin.get("properties"),
    })
}

/// Multi-node clusters (`twinhub cluster up`).
pub mod cluster;

/// Hand-built MQTT packets.
pub mod raw_mqtt;

/// A root store holding only the server's generated CA.
pub fn ca_roots(ca_pem: &[u8]) -> rumqttc::tokio_rustls::rustls::RootCertStore {
    let mut roots = rumqttc::tokio_rustls::rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert.expect("CA PEM")).expect("add CA");
    }
    roots
}

/// A rustls client configuration (ring, the default protocol versions) trusting only `ca_pem`: what
/// the tests' raw TLS sockets and MQTT-over-TLS clients use.
pub fn tls_client_config(ca_pem: &[u8]) -> std::sync::Arc<rumqttc::tokio_rustls::rustls::ClientConfig> {
    use rumqttc::tokio_rustls::rustls;
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(ca_roots(ca_pem))
            .with_no_client_auth();
    std::sync::Arc::new(config)
}

/// A child process (e.g. `twinhub watch`) whose stdout is read line by line, as JSON, as it comes;
/// killed when dropped.
pub struct JsonLines {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl JsonLines {
    /// Spawns `cmd` with its stdout piped.
    pub fn spawn(cmd: &mut Command) -> JsonLines {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn the JSON-lines child");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        JsonLines { child, lines }
    }

    /// The next line, parsed, or `None` if none comes within `within`.
    pub fn next(&self, within: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(within).ok()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("a line that is not JSON ({e}): {line}")))
    }
}

impl Drop for JsonLines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
