//! From model events to change events as IoT Hub's back-end streams carry them (docs/iothub-protocol.md §3.5): the
//! application properties, the body, and the JSON form that SSE and the broker send.

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};

use super::queue::Change;
use super::{ChangeEvent, Source};
use crate::ids::TwinId;
use crate::model::time::format_ms;
use crate::model::{Event, JsonText};

impl Source {
    /// `iothub-message-source`, also the SSE event name.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::TwinChangeEvents => "twinChangeEvents",
            Source::DeviceLifecycleEvents => "deviceLifecycleEvents",
            Source::DeviceConnectionStateEvents => "deviceConnectionStateEvents",
        }
    }

    /// `iothub-message-schema`.
    pub fn schema(self) -> &'static str {
        match self {
            Source::TwinChangeEvents => "twinChangeNotification",
            Source::DeviceLifecycleEvents => "deviceLifecycleNotification",
            Source::DeviceConnectionStateEvents => "deviceConnectionStateNotification",
        }
    }
}

/// How a feed entry may coalesce (see `queue.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `updateTwin`: a patch; merges with a pending patch of the same twin.
    Update,
    /// `replaceTwin`: the full twin; supersedes pending changes of the same twin.
    Replace,
    /// Identity created or deleted: never merges, and nothing merges across it.
    Lifecycle,
    /// Connected / disconnected: never merges.
    Connection,
}

impl ChangeEvent {
    pub fn twin_id(&self) -> TwinId {
        TwinId { device_id: self.device_id.clone(), module_id: self.module_id.clone() }
    }

    /// An application property by name.
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The twin `version` a twin change reflects (`None` for other events). Parses the body: for tests
    /// and tools, not for the feed's own paths, which never look inside a body they do not merge.
    pub fn version(&self) -> Option<i64> {
        match self.source {
            Source::TwinChangeEvents => self.body.to_value().get("version").and_then(Value::as_i64),
            _ => None,
        }
    }

    /// `{"properties": {...application properties..., "iothub-message-source"}, "body", "merged"}`:
    /// what SSE sends as `data`; the broker's payload adds `"position"` at the end
    /// (`with_position`). Written straight from the event: every consumer of every event renders it,
    /// so no intermediate JSON value (a copy of the body and of each property) is built.
    pub fn to_json_bytes(&self, with_position: bool) -> Vec<u8> {
        let wire = Wire {
            properties: Properties(self),
            body: &self.body,
            merged: self.merged,
            position: with_position.then_some(self.position.as_str()),
        };
        // Sized for the body and a few hundred bytes of properties up front: grown from serde_json's
        // 128 bytes, a kilobyte body cost four reallocations and copies, per consumer of each event.
        let mut out = Vec::with_capacity(self.body.as_str().len() + PROPERTIES_ROOM);
        // Strings, numbers and a `Value` with string keys: serialising them into memory cannot fail.
        match serde_json::to_writer(&mut out, &wire) {
            Ok(()) => out,
            Err(_) => b"{}".to_vec(),
        }
    }
}

/// Room for an event's properties (ids, timestamps, names, the position) beside its body.
const PROPERTIES_ROOM: usize = 512;

/// The JSON form of a change event, borrowed from it.
#[derive(serde::Serialize)]
struct Wire<'a> {
    properties: Properties<'a>,
    body: &'a JsonText,
    merged: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<&'a str>,
}

/// The application properties and `iothub-message-source`, as one JSON object.
struct Properties<'a>(&'a ChangeEvent);

impl Serialize for Properties<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.properties.len() + 1))?;
        for (k, v) in &self.0.properties {
            m.serialize_entry(k, v)?;
        }
        m.serialize_entry("iothub-message-source", self.0.source.as_str())?;
        m.end()
    }
}

/// A change event not yet placed in the feed: its position (and a connection event's sequence number)
/// is assigned under the feed lock, everything else is built before taking it.
pub struct Unplaced {
    pub event: ChangeEvent,
    pub kind: Kind,
    /// Bytes of the body's JSON text plus a little for the properties.
    pub size: usize,
}

impl Unplaced {
    /// The change at feed sequence `seq` (`position` is its text form): a connection event's body is
    /// that sequence.
    pub fn place(self, seq: u64, position: String) -> Change {
        let mut event = self.event;
        event.position = position;
        if self.kind == Kind::Connection {
            event.body = JsonText::render(&connection_body(seq));
        }
        Change { seq, twin: event.twin_id(), kind: self.kind, size: self.size, event: Arc::new(event) }
    }
}

/// The change event for a model event, or `None` for events that are not part of the change feed
/// (desired patches go to devices). `now_ms` is the wall clock at publish: model events carry no time
/// of their own, so `operationTimestamp` is when this node learnt of the commit.
pub fn change_of(event: Event, hub_name: &str, now_ms: i64) -> Option<Unplaced> {
    let (id, source, op_type, body, kind) = match event {
        Event::TwinChanged { id, op_type, body, .. } => {
            let kind = if op_type == "replaceTwin" { Kind::Replace } else { Kind::Update };
            (id, Source::TwinChangeEvents, op_type, body, kind)
        }
        Event::Lifecycle { id, op_type, body } => {
            (id, Source::DeviceLifecycleEvents, op_type, JsonText::render(&body), Kind::Lifecycle)
        }
        Event::Connection { id, connected } => {
            let op = if connected { "deviceConnected" } else { "deviceDisconnected" };
            // The body's sequence number is filled in with the feed position.
            (id, Source::DeviceConnectionStateEvents, op.to_string(), JsonText::render(&Value::Null), Kind::Connection)
        }
        Event::DesiredPatch { .. } => return None,
    };
    let mut properties = Vec::with_capacity(6);
    properties.push(("hubName", hub_name.to_string()));
    properties.push(("deviceId", id.device_id.clone()));
    if let Some(m) = &id.module_id {
        properties.push(("moduleId", m.clone()));
    }
    properties.push(("operationTimestamp", format_ms(now_ms)));
    properties.push(("iothub-message-schema", source.schema().to_string()));
    properties.push(("opType", op_type));
    let size = body.as_str().len() + 256;
    Some(Unplaced {
        size,
        event: ChangeEvent {
            position: String::new(),
            source,
            device_id: id.device_id,
            module_id: id.module_id,
            properties,
            body,
            merged: 1,
        },
        kind,
    })
}

/// A connection event's body: IoT Hub sends an opaque, zero-padded hex sequence number that orders
/// connection events; ours is the feed sequence.
pub fn connection_body(seq: u64) -> Value {
    json!({"sequenceNumber": format!("{seq:064X}")})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_for_each_source() {
        let e = Event::TwinChanged {
            id: TwinId::module("d1", "m1"),
            op_type: "updateTwin".into(),
            body: JsonText::render(&json!({"version": 3, "tags": {"a": 1}})),
            version: 3,
        };
        let u = change_of(e, "hub", 1_700_000_000_123).unwrap();
        assert_eq!(u.kind, Kind::Update);
        assert_eq!(
            u.event.properties,
            vec![
                ("hubName", "hub".to_string()),
                ("deviceId", "d1".into()),
                ("moduleId", "m1".into()),
                ("operationTimestamp", "2023-11-14T22:13:20.123Z".into()),
                ("iothub-message-schema", "twinChangeNotification".into()),
                ("opType", "updateTwin".into()),
            ]
        );
        assert_eq!(u.event.version(), Some(3));
        let j: Value = serde_json::from_slice(&u.event.to_json_bytes(false)).unwrap();
        assert_eq!(j["properties"]["iothub-message-source"], "twinChangeEvents");
        assert_eq!(j["properties"]["operationTimestamp"], "2023-11-14T22:13:20.123Z");
        assert_eq!(j["body"]["tags"]["a"], 1);
        assert_eq!(j["merged"], 1);
        assert!(j.get("position").is_none(), "SSE sends the position as the message id, not in data");
        // Keys in the order IoT Hub's JSON form has them; the broker adds the position last.
        let text = String::from_utf8(u.event.to_json_bytes(true)).unwrap();
        assert!(text.starts_with(r#"{"properties":{"hubName":"hub","deviceId":"d1","moduleId":"m1","#), "{text}");
        assert!(text.ends_with(r#""iothub-message-source":"twinChangeEvents"},"body":{"version":3,"tags":{"a":1}},"merged":1,"position":""}"#), "{text}");

        let c = change_of(Event::Connection { id: TwinId::device("d2"), connected: false }, "hub", 0).unwrap();
        assert_eq!(c.kind, Kind::Connection);
        assert_eq!(c.event.property("opType"), Some("deviceDisconnected"));
        assert_eq!(c.event.property("iothub-message-schema"), Some("deviceConnectionStateNotification"));
        assert_eq!(c.event.property("moduleId"), None);

        let l = Event::Lifecycle { id: TwinId::device("d3"), op_type: "deleteDeviceIdentity".into(), body: json!({}) };
        let l = change_of(l, "hub", 0).unwrap();
        assert_eq!((l.kind, l.event.source), (Kind::Lifecycle, Source::DeviceLifecycleEvents));
        assert_eq!(l.event.property("iothub-message-schema"), Some("deviceLifecycleNotification"));

        let r = Event::TwinChanged {
            id: TwinId::device("d"),
            op_type: "replaceTwin".into(),
            body: JsonText::render(&json!({})),
            version: 2,
        };
        assert_eq!(change_of(r, "hub", 0).unwrap().kind, Kind::Replace);
        let p =
            Event::DesiredPatch { id: TwinId::device("d"), patch: JsonText::render(&json!({})), desired_version: 2 };
        assert!(change_of(p, "hub", 0).is_none());
        assert_eq!(connection_body(255)["sequenceNumber"].as_str().unwrap().len(), 64);
        assert!(connection_body(255)["sequenceNumber"].as_str().unwrap().ends_with("00FF"));
    }
}
