//! `twinhub watch [--device ID [--module M]] [--from POSITION]`: the change feed as JSON lines.
//!
//! Each line is `{"position": …, "event": …, "data": {…}}`. `event` is the IoT Hub stream
//! (`twinChangeEvents`, `deviceLifecycleEvents`, `deviceConnectionStateEvents`) or `resync` when the
//! hub can no longer serve the position asked for (re-read what you care about). To resume after
//! stopping, pass the last position printed to `--from`; a dropped connection is resumed the same way
//! without being asked.

use std::time::Duration;

use clap::Args;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::{print_line, resolve, API};
use crate::cli::remote::{Remote, RemoteError, Target};

/// Longest wait for the feed's answer head (the stream itself may be quiet for as long as it likes).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Only this device's events
    #[arg(long)]
    pub device: Option<String>,
    /// Only this module's events (with --device)
    #[arg(long, requires = "device")]
    pub module: Option<String>,
    /// Resume after this position (a `position` printed before)
    #[arg(long)]
    pub from: Option<String>,
    /// Exit after this many events
    #[arg(long)]
    pub count: Option<u64>,
    #[command(flatten)]
    pub target: Target,
}

/// One SSE message, assembled from its lines.
#[derive(Default)]
struct Message {
    event: Option<String>,
    id: Option<String>,
    data: String,
}

impl Message {
    /// Feeds one line; returns the message when a blank line ends it.
    fn line(&mut self, line: &str) -> Option<Message> {
        if line.is_empty() {
            return (!self.data.is_empty()).then(|| std::mem::take(self));
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').map_or((line, ""), |(f, v)| (f, v.strip_prefix(' ').unwrap_or(v)));
        match field {
            "event" => self.event = Some(value.to_string()),
            "id" => self.id = Some(value.to_string()),
            "data" => {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(value);
            }
            _ => {}
        }
        None
    }
}

pub async fn main(a: WatchArgs) -> Result<(), RemoteError> {
    let r = resolve(&a.target)?;
    let seg = crate::auth::client::path_segment;
    let mut path = format!("/twin-changes?api-version={API}");
    if let Some(d) = &a.device {
        path.push_str(&format!("&deviceId={}", seg(d)));
    }
    if let Some(m) = &a.module {
        path.push_str(&format!("&moduleId={}", seg(m)));
    }
    let mut position = a.from.clone();
    let mut seen = 0u64;
    let mut failures = 0u32;
    loop {
        match follow(&r, &path, &mut position, &mut seen, a.count).await {
            Ok(true) => return Ok(()),
            // The stream ended (a node restart, an idle proxy): resume from the last position.
            Ok(false) => failures = 0,
            Err(e @ (RemoteError::Usage(_) | RemoteError::Hub { .. })) => return Err(e),
            Err(e) => {
                failures += 1;
                if failures >= 5 {
                    return Err(e);
                }
                eprintln!("twinhub: {e}; reconnecting");
            }
        }
        tokio::time::sleep(Duration::from_millis(500 * u64::from(failures.max(1)))).await;
    }
}

/// Reads the feed until it ends (`false`) or `count` events were printed (`true`).
async fn follow(
    r: &Remote,
    path: &str,
    position: &mut Option<String>,
    seen: &mut u64,
    count: Option<u64>,
) -> Result<bool, RemoteError> {
    let mut headers = vec![("accept", "text/event-stream".to_string())];
    if let Some(p) = position.as_ref() {
        headers.push(("last-event-id", p.clone()));
    }
    let resp = r.open(path, &headers, OPEN_TIMEOUT).await?;
    let mut body = resp.into_body();
    let mut pending = Vec::<u8>::new();
    let mut msg = Message::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            RemoteError::Unreachable(crate::cli::https::HttpsError::Http {
                addr: r.addr.to_string(),
                msg: e.to_string(),
            })
        })?;
        let Some(chunk) = frame.data_ref() else { continue };
        pending.extend_from_slice(chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let raw: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&raw[..end]);
            let Some(done) = msg.line(line.trim_end_matches('\r')) else { continue };
            let data: Value = serde_json::from_str(&done.data).unwrap_or(Value::String(done.data.clone()));
            if done.id.is_some() {
                position.clone_from(&done.id);
            }
            let event = done.event.unwrap_or_else(|| "message".into());
            if event == "resync" {
                eprintln!(
                    "twinhub: the feed could not resume from the position asked for: re-read the twins you follow"
                );
            }
            if !print_line(&json!({"position": done.id, "event": event, "data": data})) {
                return Ok(true);
            }
            *seen += 1;
            if count.is_some_and(|c| *seen >= c) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_lines_make_messages() {
        let mut m = Message::default();
        for l in [": keep-alive", "id: 3.17", "event: twinChangeEvents", "data: {\"a\":", "data: 1}"] {
            assert!(m.line(l).is_none());
        }
        let done = m.line("").unwrap();
        assert_eq!(done.id.as_deref(), Some("3.17"));
        assert_eq!(done.event.as_deref(), Some("twinChangeEvents"));
        assert_eq!(done.data, "{\"a\":\n1}");
        assert!(m.line("").is_none(), "a blank line alone is no message");
    }
}
