//! Identities (devices and modules) with their twins, and their REST renderings (docs/iothub-protocol.md §3.1–3.2).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

use super::command::{AuthSpec, RequestId, Status};
use super::etag::{etag_text, Etag};
use super::json_text::JsonText;
use super::json_write::{write_json_int, write_json_str};
use super::packed::{to_value, write_members, MembersOf, Packed, Section};
use super::time::{format_ms, Timestamp, NEVER};

/// What devices and modules share: authentication, connection state, identity etag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    pub generation_id: GenerationId,
    /// Identity etag counter (`etag` of Device/Module, `deviceEtag` of a twin).
    pub etag: u64,
    pub auth: AuthSpec,
    pub connected: bool,
    pub connection_state_updated: i64,
    pub last_activity: i64,
    /// The MQTT subscriptions (filter, QoS) of the identity's persistent session, kept through Raft so
    /// that a device reconnecting to any node finds them (IoT Hub keeps sessions across its gateways).
    /// Always written (never skipped when empty): binary snapshots have no field names to miss.
    /// A boxed slice: a fleet's identities hold none, and an empty `Vec` would cost its capacity field.
    #[serde(default)]
    pub subscriptions: Box<[(String, u8)]>,
}

impl Identity {
    pub fn new(auth: AuthSpec, request_id: RequestId, etag: u64) -> Identity {
        Identity {
            generation_id: GenerationId::of(request_id),
            etag,
            auth,
            connected: false,
            connection_state_updated: NEVER,
            last_activity: NEVER,
            subscriptions: Box::default(),
        }
    }

    fn connection_state(&self) -> &'static str {
        if self.connected {
            "Connected"
        } else {
            "Disconnected"
        }
    }

    fn authentication(&self) -> Value {
        json!({
            "symmetricKey": {"primaryKey": self.auth.primary_key, "secondaryKey": self.auth.secondary_key},
            "x509Thumbprint": {
                "primaryThumbprint": self.auth.primary_thumbprint,
                "secondaryThumbprint": self.auth.secondary_thumbprint,
            },
            "type": self.auth.auth_type,
        })
    }
}

/// IoT Hub's generationId, an 18-digit decimal. Ours derives from the creating command's request id so
/// every replica computes the same one, and a re-created device gets a new one. Held as the number
/// (a heap block less per identity) and written as its text everywhere, as it always was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationId(u64);

impl GenerationId {
    fn of(request_id: RequestId) -> GenerationId {
        GenerationId((request_id.0 % 1_000_000_000_000_000_000) as u64)
    }
}

impl std::fmt::Display for GenerationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:018}", self.0)
    }
}

impl GenerationId {
    /// The 18 digits, written without a formatter: every snapshot writes one per identity.
    fn digits(self) -> [u8; 18] {
        let mut out = [b'0'; 18];
        let mut n = self.0;
        for d in out.iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
        out
    }
}

impl Serialize for GenerationId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let digits = self.digits();
        match std::str::from_utf8(&digits) {
            Ok(text) => s.serialize_str(text),
            Err(_) => s.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for GenerationId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<GenerationId, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        match text.parse::<u64>() {
            Ok(n) if text.len() == 18 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(GenerationId(n)),
            _ => Err(serde::de::Error::custom(format!("generationId must be 18 digits, got '{text}'"))),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TwinDoc {
    /// Twin etag counter: changes on every tags or desired change.
    pub etag: u64,
    pub version: i64,
    pub tags: Packed,
    pub desired: Packed,
    pub desired_version: i64,
    pub reported: Packed,
    pub reported_version: i64,
    /// Configuration marks (id → `Applied` | `Targeted`), rendered as `configurations`.
    #[serde(default)]
    pub configurations: Marks,
}

/// A twin's configuration marks, boxed: most twins of a fleet have none, and an empty map inline
/// would cost three words in every twin. Written as the map itself.
#[derive(Clone, Debug, Default, PartialEq)]
#[allow(clippy::box_collection)] // one word when empty, which is the point
pub struct Marks(Option<Box<BTreeMap<String, String>>>);

static NO_MARKS: BTreeMap<String, String> = BTreeMap::new();

impl Marks {
    pub fn get(&self) -> &BTreeMap<String, String> {
        self.0.as_deref().unwrap_or(&NO_MARKS)
    }

    pub fn set(&mut self, marks: BTreeMap<String, String>) {
        self.0 = (!marks.is_empty()).then(|| Box::new(marks));
    }
}

impl Serialize for Marks {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Marks {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Marks, D::Error> {
        let mut marks = Marks::default();
        marks.set(BTreeMap::deserialize(d)?);
        Ok(marks)
    }
}

impl TwinDoc {
    pub fn new(etag: u64) -> TwinDoc {
        TwinDoc {
            etag,
            version: 1,
            tags: Packed::empty_section(),
            desired: Packed::empty_section(),
            desired_version: 1,
            reported: Packed::empty_section(),
            reported_version: 1,
            configurations: Marks::default(),
        }
    }

    /// The device view: `{"desired", "reported"}` with `$metadata` and `$version`.
    pub fn properties(&self) -> Value {
        to_value(&Properties(self))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceEntry {
    pub identity: Identity,
    pub status: Status,
    pub status_reason: Option<Box<str>>,
    pub status_updated: i64,
    pub iot_edge: bool,
    pub twin: TwinDoc,
    pub modules: BTreeMap<String, ModuleEntry>,
    /// Edge scopes: an edge device's own `deviceScope`; a leaf's parent edge scope (as its
    /// `deviceScope` and only `parentScopes` entry); an edge device's parent (`parentScopes`).
    #[serde(default)]
    pub scopes: Scopes,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scopes {
    pub device_scope: Option<Box<str>>,
    pub parent_scopes: Box<[String]>,
}

/// The scope IoT Hub gives an edge device: `ms-azure-iot-edge://{deviceId}-{number}`.
pub fn edge_scope(device_id: &str, number: u64) -> String {
    format!("{EDGE_SCOPE_PREFIX}{device_id}-{number}")
}

pub const EDGE_SCOPE_PREFIX: &str = "ms-azure-iot-edge://";

/// The device id an edge scope names, if `scope` is one.
pub fn edge_scope_device(scope: &str) -> Option<&str> {
    let rest = scope.strip_prefix(EDGE_SCOPE_PREFIX)?;
    let (device, number) = rest.rsplit_once('-')?;
    (!device.is_empty() && !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())).then_some(device)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleEntry {
    pub identity: Identity,
    pub managed_by: Option<String>,
    pub twin: TwinDoc,
}

fn status_text(s: Status) -> &'static str {
    match s {
        Status::Enabled => "enabled",
        Status::Disabled => "disabled",
    }
}

impl DeviceEntry {
    pub fn render(&self, device_id: &str) -> Value {
        let id = &self.identity;
        json!({
            "deviceId": device_id,
            "generationId": id.generation_id,
            "etag": etag_text(id.etag),
            "connectionState": id.connection_state(),
            "status": status_text(self.status),
            "statusReason": self.status_reason,
            "connectionStateUpdatedTime": format_ms(id.connection_state_updated),
            "statusUpdatedTime": format_ms(self.status_updated),
            "lastActivityTime": format_ms(id.last_activity),
            "cloudToDeviceMessageCount": 0,
            "authentication": id.authentication(),
            "capabilities": {"iotEdge": self.iot_edge},
            "deviceScope": self.scopes.device_scope,
            "parentScopes": self.scopes.parent_scopes,
        })
    }

    /// The service view of the device twin (or of one of its modules' twins).
    pub fn render_twin(&self, device_id: &str, module: Option<(&str, &ModuleEntry)>) -> Value {
        self.render_twin_members(device_id, module, &|_| true)
    }

    /// [`DeviceEntry::render_twin`] with only the top-level members `want` accepts (plus the ids,
    /// which every row is keyed by): a query renders what its WHERE clause reads to test a twin, and
    /// the whole twin only if it matches.
    pub fn render_twin_members(
        &self,
        device_id: &str,
        module: Option<(&str, &ModuleEntry)>,
        want: &dyn Fn(&str) -> bool,
    ) -> Value {
        to_value(&TwinView { twin: TwinRef { device_id, device: self, module }, want })
    }
}

/// A twin document as a serde map: the tree ([`DeviceEntry::render_twin_members`]), with only the
/// members `want` accepts.
struct TwinView<'a> {
    twin: TwinRef<'a>,
    want: &'a dyn Fn(&str) -> bool,
}

impl Serialize for TwinView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        write_twin(self.twin, self.want, &mut MapOut(&mut map))?;
        map.end()
    }
}

/// Where the members of a twin document go, so that one list of them ([`write_twin`]) gives both the
/// tree (through serde, [`MapOut`]) and the text a twin write answers (written straight, [`TextOut`]).
trait TwinOut {
    type Error;
    fn entry<V: Member + ?Sized>(&mut self, name: Name, value: &V) -> Result<(), Self::Error>;
    fn time(&mut self, name: Name, at: Timestamp) -> Result<(), Self::Error>;
    fn tags(&mut self, twin: &TwinDoc) -> Result<(), Self::Error>;
    fn properties(&mut self, twin: &TwinDoc) -> Result<(), Self::Error>;
}

/// A member's name at a twin document's top level, with the text [`TextOut`] writes before its value
/// (`,"name":`), made when this file is compiled: one copy per member instead of a quote, the name, a
/// quote and a colon each checked and copied apart.
#[derive(Clone, Copy)]
struct Name {
    name: &'static str,
    quoted: &'static str,
}

/// The [`Name`] of a literal (none of which a JSON string escapes).
macro_rules! name {
    ($name:literal) => {
        Name { name: $name, quoted: concat!(",\"", $name, "\":") }
    };
}

/// The members of a twin document, in IoT Hub's order; the ids always, the rest where `want` accepts
/// their names.
fn write_twin<O: TwinOut>(twin: TwinRef<'_>, want: &dyn Fn(&str) -> bool, out: &mut O) -> Result<(), O::Error> {
    let TwinRef { device_id, device, module } = twin;
    let (identity, doc) = match module {
        Some((_, m)) => (&m.identity, &m.twin),
        None => (&device.identity, &device.twin),
    };
    out.entry(name!("deviceId"), device_id)?;
    if let Some((mid, _)) = module {
        out.entry(name!("moduleId"), mid)?;
    }
    macro_rules! put {
        ($name:literal, $value:expr) => {
            if want($name) {
                out.entry(name!($name), &$value)?;
            }
        };
    }
    put!("etag", Etag(doc.etag));
    put!("deviceEtag", Etag(identity.etag));
    put!("status", status_text(device.status));
    put!("statusReason", device.status_reason);
    if want("statusUpdateTime") {
        out.time(name!("statusUpdateTime"), Timestamp(device.status_updated))?;
    }
    put!("connectionState", identity.connection_state());
    if want("lastActivityTime") {
        out.time(name!("lastActivityTime"), Timestamp(identity.last_activity))?;
    }
    put!("cloudToDeviceMessageCount", 0);
    put!("authenticationType", identity.auth.auth_type);
    put!(
        "x509Thumbprint",
        Thumbprints { primary: &identity.auth.primary_thumbprint, secondary: &identity.auth.secondary_thumbprint }
    );
    put!("modelId", "");
    put!("version", doc.version);
    if module.is_none() {
        put!("capabilities", Capabilities { iot_edge: device.iot_edge });
        if let Some(scope) = &device.scopes.device_scope {
            put!("deviceScope", scope);
        }
        if !device.scopes.parent_scopes.is_empty() {
            put!("parentScopes", device.scopes.parent_scopes);
        }
    }
    if !doc.configurations.get().is_empty() {
        put!("configurations", super::config::render_marks(doc.configurations.get()));
    }
    if want("tags") {
        out.tags(doc)?;
    }
    if want("properties") {
        out.properties(doc)?;
    }
    Ok(())
}

/// The twin's members into a serde map.
struct MapOut<'m, M>(&'m mut M);

impl<M: serde::ser::SerializeMap> TwinOut for MapOut<'_, M> {
    type Error = M::Error;

    fn entry<V: Member + ?Sized>(&mut self, name: Name, value: &V) -> Result<(), M::Error> {
        self.0.serialize_entry(name.name, value)
    }

    fn time(&mut self, name: Name, at: Timestamp) -> Result<(), M::Error> {
        self.0.serialize_entry(name.name, &at)
    }

    fn tags(&mut self, twin: &TwinDoc) -> Result<(), M::Error> {
        self.0.serialize_entry("tags", &MembersOf(twin.tags.root()))
    }

    fn properties(&mut self, twin: &TwinDoc) -> Result<(), M::Error> {
        self.0.serialize_entry("properties", &Properties(twin))
    }
}

/// The twin's members written as JSON text, the same bytes serde_json writes for [`MapOut`]: values by
/// [`Member::write_json`], the sections by [`Section::write_text`] and [`write_members`].
struct TextOut<'b> {
    out: &'b mut Vec<u8>,
    first: bool,
}

impl TextOut<'_> {
    /// `"name":`, after a comma unless it is the first member.
    fn key(&mut self, name: Name) {
        debug_assert!(!name.name.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\'), "{}", name.name);
        let quoted = if std::mem::take(&mut self.first) { &name.quoted[1..] } else { name.quoted };
        self.out.extend_from_slice(quoted.as_bytes());
    }
}

impl TwinOut for TextOut<'_> {
    type Error = serde_json::Error;

    fn entry<V: Member + ?Sized>(&mut self, name: Name, value: &V) -> Result<(), serde_json::Error> {
        self.key(name);
        value.write_json(self.out);
        Ok(())
    }

    fn time(&mut self, name: Name, at: Timestamp) -> Result<(), serde_json::Error> {
        self.key(name);
        at.write_json(self.out);
        Ok(())
    }

    fn tags(&mut self, twin: &TwinDoc) -> Result<(), serde_json::Error> {
        self.key(name!("tags"));
        write_members(self.out, twin.tags.root());
        Ok(())
    }

    fn properties(&mut self, twin: &TwinDoc) -> Result<(), serde_json::Error> {
        self.key(name!("properties"));
        let [desired, reported] = Properties(twin).sections();
        self.out.extend_from_slice(b"{\"desired\":");
        desired.write_text(self.out);
        self.out.extend_from_slice(b",\"reported\":");
        reported.write_text(self.out);
        self.out.push(b'}');
        Ok(())
    }
}

/// A value of a twin document's top level, which [`TextOut`] writes as text and [`MapOut`] through serde.
/// Written through serde_json by default, the bytes it writes for the value; the values every twin
/// has are written straight, the same bytes without a serializer (`twin_text_is_the_rendered_document_byte_for_byte`
/// compares the two renderings). Through serde_json they were a third of what rendering a twin cost:
/// a serializer per value, strings checked for escapes byte by byte, each etag's base64 checked as
/// UTF-8 (benches/README.md).
trait Member: Serialize {
    fn write_json(&self, out: &mut Vec<u8>) {
        let _ = serde_json::to_writer(out, self); // cannot fail: nothing here has a map with other keys
    }
}

impl<T: Member + ?Sized> Member for &T {
    fn write_json(&self, out: &mut Vec<u8>) {
        (**self).write_json(out)
    }
}

impl Member for str {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_json_str(out, self.as_bytes())
    }
}

impl Member for Option<Box<str>> {
    fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Some(text) => write_json_str(out, text.as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
    }
}

impl Member for i64 {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_json_int(out, *self)
    }
}

impl Member for i32 {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_json_int(out, i64::from(*self))
    }
}

impl Member for Etag {
    fn write_json(&self, out: &mut Vec<u8>) {
        Etag::write_json(*self, out)
    }
}

impl Member for super::command::AuthType {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_json_str(out, self.as_str().as_bytes())
    }
}

impl Member for Thumbprints<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"primaryThumbprint\":");
        self.primary.write_json(out);
        out.extend_from_slice(b",\"secondaryThumbprint\":");
        self.secondary.write_json(out);
        out.push(b'}');
    }
}

impl Member for Capabilities {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(if self.iot_edge { b"{\"iotEdge\":true}" } else { b"{\"iotEdge\":false}" });
    }
}

// Rare at a twin's top level: through serde_json.
impl Member for Box<str> {}
impl Member for Box<[String]> {}
impl Member for Value {}

#[derive(Serialize)]
struct Thumbprints<'a> {
    #[serde(rename = "primaryThumbprint")]
    primary: &'a Option<Box<str>>,
    #[serde(rename = "secondaryThumbprint")]
    secondary: &'a Option<Box<str>>,
}

#[derive(Serialize)]
struct Capabilities {
    #[serde(rename = "iotEdge")]
    iot_edge: bool,
}

/// The device view of a twin: `{"desired", "reported"}`, each with `$metadata` and `$version`.
struct Properties<'a>(&'a TwinDoc);

impl<'a> Properties<'a> {
    fn sections(&self) -> [Section<'a>; 2] {
        let t = self.0;
        [
            Section { node: t.desired.root(), version: t.desired_version, with_version: true },
            Section { node: t.reported.root(), version: t.reported_version, with_version: false },
        ]
    }
}

impl Serialize for Properties<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let [desired, reported] = self.sections();
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("desired", &desired)?;
        map.serialize_entry("reported", &reported)?;
        map.end()
    }
}

/// A device or module twin as a shard holds it, not yet rendered as a document.
#[derive(Clone, Copy, Debug)]
pub struct TwinRef<'a> {
    pub device_id: &'a str,
    pub device: &'a DeviceEntry,
    pub module: Option<(&'a str, &'a ModuleEntry)>,
}

impl<'a> TwinRef<'a> {
    /// The twin's own state (the module's, for a module twin).
    pub fn twin(&self) -> &'a TwinDoc {
        match self.module {
            Some((_, m)) => &m.twin,
            None => &self.device.twin,
        }
    }

    /// The whole twin document.
    pub fn render(&self) -> Value {
        self.device.render_twin(self.device_id, self.module)
    }

    /// The whole twin document as JSON text, written straight from the packed twin: the same bytes as
    /// rendering [`TwinRef::render`] would give, without building that tree.
    pub fn render_text(&self) -> JsonText {
        JsonText::written(|buf| {
            buf.push(b'{');
            write_twin(*self, &|_| true, &mut TextOut { out: &mut *buf, first: true })?;
            buf.push(b'}');
            Ok(())
        })
    }

    /// [`TwinRef::render_text`] through serde ([`TwinView`]): the same bytes, more slowly.
    pub fn render_text_via_serde(&self) -> JsonText {
        JsonText::of(&TwinView { twin: *self, want: &|_| true })
    }

    /// The ids and the top-level members `want` accepts.
    pub fn render_members(&self, want: &dyn Fn(&str) -> bool) -> Value {
        self.device.render_twin_members(self.device_id, self.module, want)
    }
}

impl ModuleEntry {
    pub fn render(&self, device_id: &str, module_id: &str) -> Value {
        let id = &self.identity;
        json!({
            "moduleId": module_id,
            "managedBy": self.managed_by,
            "deviceId": device_id,
            "generationId": id.generation_id,
            "etag": etag_text(id.etag),
            "connectionState": id.connection_state(),
            "connectionStateUpdatedTime": format_ms(id.connection_state_updated),
            "lastActivityTime": format_ms(id.last_activity),
            "cloudToDeviceMessageCount": 0,
            "authentication": id.authentication(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_ids_serialize_as_their_18_digits() {
        for n in [0, 7, 123_456_789, 999_999_999_999_999_999] {
            let g = GenerationId(n);
            let text = format!("{n:018}");
            assert_eq!(serde_json::to_value(g).unwrap(), serde_json::Value::String(text.clone()));
            assert_eq!(g.to_string(), text);
            let back: GenerationId = postcard::from_bytes(&postcard::to_allocvec(&g).unwrap()).unwrap();
            assert_eq!(back, g);
        }
    }
}
