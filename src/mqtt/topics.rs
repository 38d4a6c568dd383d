//! Topic names and filters of IoT Hub's device protocol (docs/iothub-protocol.md §1.4), always read in the scope of the
//! connection's identity (docs/architecture.md, invariant 8): a topic never says *which* twin, the connection does.
//! Pure functions, no I/O.

use crate::ids::TwinId;

const TWIN_GET: &str = "$iothub/twin/GET/";
const TWIN_PATCH_REPORTED: &str = "$iothub/twin/PATCH/properties/reported/";
const TWIN_RES: &str = "$iothub/twin/res/";
const TWIN_PATCH_DESIRED: &str = "$iothub/twin/PATCH/properties/desired/";
const METHOD_POST: &str = "$iothub/methods/POST/";
const METHOD_RES: &str = "$iothub/methods/res/";

/// A twin request a device may publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinRequest {
    Get,
    PatchReported,
}

impl TwinRequest {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            TwinRequest::Get => "get",
            TwinRequest::PatchReported => "patch_reported",
        }
    }
}

/// What a device's PUBLISH means, given the identity of its connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// A well-formed twin request; `rid` is echoed byte for byte in the answer.
    Twin { kind: TwinRequest, rid: &'a str },
    /// A twin request with a `$rid` but an otherwise malformed query string: answered with 400.
    BadTwinQuery { kind: TwinRequest, rid: &'a str, why: String },
    /// A twin request without `$rid`: there is no way to address an answer, so it is dropped (logged).
    NoRid { kind: TwinRequest, why: String },
    /// A device's answer to a direct method call: `$iothub/methods/res/{status}/?$rid={rid}`.
    MethodResponse { status: i64, rid: &'a str },
    /// A malformed method answer: acknowledged and dropped (it cannot be matched to a call).
    BadMethodResponse(String),
    /// Device-to-cloud telemetry on the identity's own topic: acknowledged and dropped (out of scope).
    Telemetry,
    /// Anything else (another identity's topic, an unknown `$iothub/...`): the connection is closed.
    OutOfScope(String),
}

/// Interprets a published topic for the identity `id`.
pub fn classify<'a>(topic: &'a str, id: &TwinId) -> Inbound<'a> {
    for (prefix, kind) in [(TWIN_GET, TwinRequest::Get), (TWIN_PATCH_REPORTED, TwinRequest::PatchReported)] {
        let Some(rest) = topic.strip_prefix(prefix) else { continue };
        let Some(query) = rest.strip_prefix('?') else {
            return if rest.is_empty() {
                Inbound::NoRid { kind, why: format!("'{topic}' has no query string with $rid") }
            } else {
                Inbound::OutOfScope(format!("unknown twin topic '{topic}'"))
            };
        };
        return match parse_query(query) {
            Ok(rid) => Inbound::Twin { kind, rid },
            Err(QueryError { rid: Some(rid), why }) => Inbound::BadTwinQuery { kind, rid, why },
            Err(QueryError { rid: None, why }) => Inbound::NoRid { kind, why },
        };
    }
    if let Some(rest) = topic.strip_prefix(METHOD_RES) {
        return method_response(rest);
    }
    if is_own_telemetry(topic, id) {
        return Inbound::Telemetry;
    }
    if topic.starts_with("$iothub/") {
        Inbound::OutOfScope(format!("unsupported topic '{topic}'"))
    } else {
        Inbound::OutOfScope(format!("topic '{topic}' is not in the scope of {id}"))
    }
}

/// `devices/{d}/messages/events[/...]` or `devices/{d}/modules/{m}/messages/events[/...]` of exactly
/// this identity (the part after `events/` is the URL-encoded property bag).
fn is_own_telemetry(topic: &str, id: &TwinId) -> bool {
    let own = match &id.module_id {
        None => format!("devices/{}/messages/events", id.device_id),
        Some(m) => format!("devices/{}/modules/{m}/messages/events", id.device_id),
    };
    match topic.strip_prefix(own.as_str()) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// `{status}/?$rid={rid}`, the part of a method answer's topic after `$iothub/methods/res/`.
fn method_response(rest: &str) -> Inbound<'_> {
    let Some((status, query)) = rest.split_once("/?") else {
        return Inbound::BadMethodResponse(format!("method response topic '{METHOD_RES}{rest}' has no '/?$rid='"));
    };
    let Ok(status) = status.parse::<i64>() else {
        return Inbound::BadMethodResponse(format!("method response status '{status}' is not an integer"));
    };
    match parse_query(query) {
        Ok(rid) => Inbound::MethodResponse { status, rid },
        Err(e) => Inbound::BadMethodResponse(e.why),
    }
}

/// `$iothub/methods/POST/{method}/?$rid={rid}`, the method name percent-encoded (the SDKs decode it).
pub fn method_topic(method: &str, rid: &str) -> String {
    const SET: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    format!("{METHOD_POST}{}/?$rid={rid}", percent_encoding::utf8_percent_encode(method, SET))
}

#[derive(Debug, PartialEq, Eq)]
struct QueryError<'a> {
    rid: Option<&'a str>,
    why: String,
}

/// The `$rid` of a twin request's query string. `$rid` must come first and every parameter must be
/// `key=value` (docs/iothub-protocol.md §1.4); when the rule is broken but a `$rid` exists, it is returned with the error
/// so that the answer can still reach the requester.
fn parse_query(query: &str) -> Result<&str, QueryError<'_>> {
    let params: Vec<&str> = query.split('&').collect();
    let rid = params.iter().find_map(|p| p.strip_prefix("$rid="));
    let fail = |why: String| Err(QueryError { rid, why });
    if rid.is_none() {
        return fail(format!("query '{query}' has no $rid"));
    }
    if let Some(p) = params.iter().find(|p| !p.contains('=') || p.starts_with('=')) {
        return fail(format!("query parameter '{p}' is not key=value"));
    }
    if params.iter().filter(|p| p.starts_with("$rid=")).count() > 1 {
        return fail("$rid appears more than once".into());
    }
    match params.first().and_then(|p| p.strip_prefix("$rid=")) {
        Some("") => fail("$rid is empty".into()),
        Some(r) => Ok(r),
        None => fail("$rid must be the first query parameter".into()),
    }
}

/// `$iothub/twin/res/{status}/?$rid={rid}[&$version={version}]`.
pub fn response_topic(status: u16, rid: &str, version: Option<i64>) -> String {
    match version {
        Some(v) => format!("{TWIN_RES}{status}/?$rid={rid}&$version={v}"),
        None => format!("{TWIN_RES}{status}/?$rid={rid}"),
    }
}

/// `$iothub/twin/PATCH/properties/desired/?$version={version}`.
pub fn desired_topic(version: i64) -> String {
    format!("{TWIN_PATCH_DESIRED}?$version={version}")
}

/// Whether `filter` is a syntactically valid MQTT topic filter that we accept: non-empty, no NUL,
/// `+` and `#` only as whole levels, `#` only last. Shared subscriptions (`$share/...`, MQTT 5) are not
/// supported.
pub fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.contains('\0') || filter.starts_with("$share/") {
        return false;
    }
    let levels: Vec<&str> = filter.split('/').collect();
    let last = levels.len() - 1;
    levels.iter().enumerate().all(|(i, l)| match *l {
        "#" => i == last,
        "+" => true,
        l => !l.contains(['#', '+']),
    })
}

/// MQTT topic matching (3.1.1 §4.7): `+` matches one level, a trailing `#` matches the parent level and
/// everything below; a filter starting with a wildcard does not match a topic starting with `$`.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut topic_levels = topic.split('/');
    for f in filter.split('/') {
        if f == "#" {
            return true;
        }
        match topic_levels.next() {
            Some(t) if f == "+" || f == t => {}
            _ => return false,
        }
    }
    topic_levels.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> TwinId {
        TwinId::device("dev1")
    }

    #[test]
    fn twin_requests_of_every_sdk() {
        let id = dev();
        // Python/Node: UUID rid; C: decimal counter.
        assert_eq!(
            classify("$iothub/twin/GET/?$rid=7a53d196-e4f1-4071-b437-0b2a38b88a48", &id),
            Inbound::Twin { kind: TwinRequest::Get, rid: "7a53d196-e4f1-4071-b437-0b2a38b88a48" }
        );
        assert_eq!(
            classify("$iothub/twin/PATCH/properties/reported/?$rid=42", &id),
            Inbound::Twin { kind: TwinRequest::PatchReported, rid: "42" }
        );
        // Extra parameters after $rid are fine; the rid is echoed exactly.
        assert_eq!(
            classify("$iothub/twin/PATCH/properties/reported/?$rid=a%20b&$version=3", &id),
            Inbound::Twin { kind: TwinRequest::PatchReported, rid: "a%20b" }
        );
    }

    #[test]
    fn method_topics() {
        let id = dev();
        assert_eq!(classify("$iothub/methods/res/200/?$rid=7", &id), Inbound::MethodResponse { status: 200, rid: "7" });
        assert_eq!(classify("$iothub/methods/res/-1/?$rid=ab", &id), Inbound::MethodResponse { status: -1, rid: "ab" });
        assert!(
            matches!(classify("$iothub/methods/res/ok/?$rid=7", &id), Inbound::BadMethodResponse(w) if w.contains("integer"))
        );
        assert!(matches!(classify("$iothub/methods/res/200", &id), Inbound::BadMethodResponse(_)));
        assert!(matches!(classify("$iothub/methods/res/200/?x=1", &id), Inbound::BadMethodResponse(_)));
        assert!(
            matches!(classify("$iothub/methods/POST/x/?$rid=1", &id), Inbound::OutOfScope(_)),
            "devices do not call methods"
        );
        assert_eq!(method_topic("reboot", "5"), "$iothub/methods/POST/reboot/?$rid=5");
        assert_eq!(method_topic("a/b c#+", "5"), "$iothub/methods/POST/a%2Fb%20c%23%2B/?$rid=5");
        assert!(matches("$iothub/methods/POST/#", &method_topic("a/b", "1")));
    }

    #[test]
    fn malformed_twin_queries() {
        let id = dev();
        assert!(matches!(
            classify("$iothub/twin/GET/?x=1&$rid=9", &id),
            Inbound::BadTwinQuery { rid: "9", why, .. } if why.contains("first")
        ));
        assert!(matches!(
            classify("$iothub/twin/GET/?$rid=9&flag", &id),
            Inbound::BadTwinQuery { rid: "9", why, .. } if why.contains("key=value")
        ));
        assert!(matches!(classify("$iothub/twin/GET/?$rid=", &id), Inbound::BadTwinQuery { rid: "", .. }));
        assert!(matches!(classify("$iothub/twin/GET/?$rid=1&$rid=2", &id), Inbound::BadTwinQuery { rid: "1", .. }));
        assert!(matches!(classify("$iothub/twin/GET/?x=1", &id), Inbound::NoRid { kind: TwinRequest::Get, .. }));
        assert!(matches!(classify("$iothub/twin/GET/", &id), Inbound::NoRid { .. }));
        assert!(matches!(classify("$iothub/twin/GET/?", &id), Inbound::NoRid { .. }));
        assert!(matches!(classify("$iothub/twin/GET/x?$rid=1", &id), Inbound::OutOfScope(_)));
        assert!(matches!(classify("$iothub/twin/GET?$rid=1", &id), Inbound::OutOfScope(_)));
    }

    #[test]
    fn telemetry_only_on_own_topics() {
        let d = dev();
        let m = TwinId::module("dev1", "mod1");
        assert_eq!(classify("devices/dev1/messages/events/", &d), Inbound::Telemetry);
        assert_eq!(classify("devices/dev1/messages/events/%24.ct=application%2Fjson", &d), Inbound::Telemetry);
        assert_eq!(classify("devices/dev1/messages/events", &d), Inbound::Telemetry);
        assert_eq!(classify("devices/dev1/modules/mod1/messages/events/", &m), Inbound::Telemetry);
        for (topic, id) in [
            ("devices/dev2/messages/events/", &d),
            ("devices/dev10/messages/events/", &d),
            ("devices/dev1/messages/eventsX", &d),
            ("devices/dev1/modules/mod1/messages/events/", &d),
            ("devices/dev1/messages/events/", &m),
            ("devices/dev1/modules/mod2/messages/events/", &m),
            ("devices/dev1/messages/devicebound/#", &d),
            ("$iothub/twin/res/200/?$rid=1", &d),
            ("$iothub/twin/PATCH/properties/desired/?$version=1", &d),
            ("", &d),
            ("#", &d),
        ] {
            assert!(matches!(classify(topic, id), Inbound::OutOfScope(_)), "{topic} for {id}");
        }
    }

    #[test]
    fn response_and_push_topics() {
        assert_eq!(response_topic(200, "abc", None), "$iothub/twin/res/200/?$rid=abc");
        assert_eq!(response_topic(204, "1", Some(6)), "$iothub/twin/res/204/?$rid=1&$version=6");
        assert_eq!(desired_topic(8), "$iothub/twin/PATCH/properties/desired/?$version=8");
    }

    #[test]
    fn filter_validity() {
        for ok in [
            "#",
            "+",
            "$iothub/twin/res/#",
            "$iothub/twin/PATCH/properties/desired/#",
            "+/#",
            "a/+/c",
            "/",
            "a//b",
            "$iothub/+/res/+/#",
        ] {
            assert!(valid_filter(ok), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a/b+", "+a/b", "##", "a/\0", "$share/g/a"] {
            assert!(!valid_filter(bad), "{bad:?}");
        }
    }

    #[test]
    fn filter_matching() {
        let res = "$iothub/twin/res/200/?$rid=1";
        let push = "$iothub/twin/PATCH/properties/desired/?$version=3";
        assert!(matches("$iothub/twin/res/#", res));
        assert!(matches("$iothub/#", res));
        assert!(matches("$iothub/twin/PATCH/properties/desired/#", push));
        assert!(matches("$iothub/twin/PATCH/properties/desired/+", push));
        assert!(matches("$iothub/twin/+/properties/desired/#", push));
        assert!(!matches("$iothub/twin/res/#", push));
        // First-level wildcards never match `$` topics.
        for f in ["#", "+/#", "+/twin/res/#", "+/+/+/+/+/+"] {
            assert!(!matches(f, res), "{f}");
            assert!(!matches(f, push), "{f}");
        }
        assert!(matches("#", "a/b"));
        assert!(matches("+/#", "a/b"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/+", "a/"));
        assert!(!matches("a/+", "a"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(!matches("a/b/c", "a/b"));
        assert!(matches("a/b", "a/b"));
    }
}
