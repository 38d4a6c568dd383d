//! The log subscriber every twinhub program (the server and its companions) starts with: lines on
//! stderr, filtered by `RUST_LOG` (default: info, quieter dependencies).
//!
//! One thing is never logged whatever the filter says: rumqttd's spans. The event broker's router
//! opens an ERROR-level span around every packet it handles (`incoming_payload`, and `publish` with
//! the topic formatted through `Debug`), only to give its own log lines context. Being ERROR, they
//! pass any level filter, so every change published to the broker's subscribers would cost two spans
//! created, their fields formatted into strings, stored and dropped, in the router thread that sits
//! between the change feed and every subscriber (measured in benches/README.md). rumqttd's events
//! still pass the filter as before; they only lose that context.

use std::io::IsTerminal;

use tracing::Metadata;
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::prelude::*;

/// The filter when `RUST_LOG` is unset or invalid.
const DEFAULT_FILTER: &str = "info,openraft=warn,fjall=warn,lsm_tree=warn";

/// Installs the subscriber as the process's global default.
pub fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    subscriber(std::io::stderr, std::io::stderr().is_terminal(), filter).init();
}

/// The subscriber: formatted lines to `writer`, through `filter`, without rumqttd's spans. Both filters
/// are global, as `tracing_subscriber::fmt().with_env_filter(…)` makes the level filter: decided once per
/// call site from its metadata, so a dropped span's macro does nothing, and the level filter's maximum
/// still lets `debug!` and `trace!` sites below it skip themselves.
fn subscriber<W>(writer: W, ansi: bool, filter: EnvFilter) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry()
        .with(filter_fn(not_a_broker_span))
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi))
}

fn not_a_broker_span(m: &Metadata<'_>) -> bool {
    !(m.is_span() && m.target().starts_with("rumqttd"))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn broker_spans_are_dropped_and_its_events_and_our_spans_kept() {
        let out = Captured::default();
        let s = subscriber(out.clone(), false, EnvFilter::new("info"));
        tracing::subscriber::with_default(s, || {
            assert_eq!(tracing::level_filters::LevelFilter::current(), tracing::level_filters::LevelFilter::INFO);
            let broker = tracing::error_span!(target: "rumqttd::router::routing", "incoming_payload", client_id = 7);
            assert!(broker.is_disabled(), "rumqttd's span was created");
            broker.in_scope(|| tracing::warn!(target: "rumqttd::router::routing", "broker event"));
            let ours = tracing::info_span!("write", shard = 3);
            assert!(!ours.is_disabled());
            ours.in_scope(|| tracing::info!("our event"));
            tracing::debug!("below the filter");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("broker event"), "{text}");
        assert!(!text.contains("incoming_payload"), "{text}");
        assert!(text.contains("write{shard=3}") && text.contains("our event"), "{text}");
        assert!(!text.contains("below the filter"), "{text}");
    }
}
