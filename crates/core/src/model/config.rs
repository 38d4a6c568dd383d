//! Automatic device configurations (docs/iothub-protocol.md §4.5): records kept in the metadata group's
//! state, and the marks each targeted twin carries (`configurations: {id: {"status": …}}`).
//!
//! A configuration targets the devices its `targetCondition` selects and sets the desired properties
//! of its `content.deviceContent` on them. Its content is immutable (IoT Hub's rule); its target
//! condition, priority, labels and metric queries can change. Where several configurations target a
//! twin, the highest priority wins (equal priorities: the most recently created); the winner's content
//! is merged into the twin's desired properties once, when it becomes the twin's applied
//! configuration, through the normal desired write (pushes and change events follow). Pure: no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::command::IfMatch;
use super::error::TwinError;
use super::etag::etag_text;
use super::time::format_ms;

/// The twin mark of the configuration whose content a twin carries, and of the others targeting it.
pub const APPLIED: &str = "Applied";
pub const TARGETED: &str = "Targeted";
/// A target condition selecting every device.
pub const ALL_DEVICES: &str = "*";

/// What a client may set (validated by [`parse`]); the record adds times and an etag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSpec {
    pub id: String,
    pub schema_version: String,
    pub labels: BTreeMap<String, String>,
    /// `content.deviceContent` as sent: `{"properties.desired.<path>": value}`.
    pub device_content_json: String,
    /// The desired-properties patch the content stands for.
    pub desired_patch_json: String,
    /// A bare WHERE clause over `devices`, or `*`.
    pub target_condition: String,
    pub priority: i64,
    /// User metrics: name → `SELECT … FROM devices WHERE …` (rows counted).
    pub metric_queries: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Configuration {
    pub spec: ConfigSpec,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub etag: u64,
}

/// A change of the configuration records (metadata-group log entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfigOp {
    /// Without `if_match`: create (`ConfigurationAlreadyExists` if present). With it: update the
    /// mutable fields of an existing one.
    Put {
        spec: ConfigSpec,
        if_match: Option<IfMatch>,
    },
    Delete {
        id: String,
        if_match: Option<IfMatch>,
    },
}

impl ConfigOp {
    pub fn id(&self) -> &str {
        match self {
            ConfigOp::Put { spec, .. } => &spec.id,
            ConfigOp::Delete { id, .. } => id,
        }
    }
}

/// Configurations a hub holds at most (IoT Hub's paid tiers allow as many): each one is evaluated
/// against the whole fleet on every reconciler pass, so their number bounds that work.
pub const MAX_CONFIGURATIONS: usize = 100;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigsState {
    pub configs: BTreeMap<String, Configuration>,
    /// Last etag handed out; also tells the reconciler that something changed.
    pub etag_seq: u64,
}

fn check_etag(c: &Configuration, if_match: Option<&IfMatch>) -> Result<(), TwinError> {
    match if_match {
        Some(IfMatch::Etag(e)) if *e != etag_text(c.etag) => {
            Err(TwinError::PreconditionFailed(format!("configuration {} has another etag", c.spec.id)))
        }
        _ => Ok(()),
    }
}

impl ConfigsState {
    /// Applies a change at `at_ms`; answers the record as it is after (`Null` after a delete).
    pub fn apply(&mut self, op: &ConfigOp, at_ms: i64) -> Result<Value, TwinError> {
        match op {
            ConfigOp::Put { spec, if_match } => {
                let etag = self.etag_seq + 1;
                match (self.configs.get_mut(&spec.id), if_match) {
                    (Some(_), None) => Err(TwinError::ConfigurationAlreadyExists(spec.id.clone())),
                    (None, Some(_)) => Err(TwinError::ConfigurationNotFound(spec.id.clone())),
                    (Some(c), Some(m)) => {
                        check_etag(c, Some(m))?;
                        if c.spec.device_content_json != spec.device_content_json {
                            return Err(TwinError::InvalidArgument(format!(
                                "the content of configuration {} cannot be changed; create a new configuration",
                                spec.id
                            )));
                        }
                        c.spec = spec.clone();
                        c.updated_ms = at_ms;
                        c.etag = etag;
                        self.etag_seq = etag;
                        Ok(c.render())
                    }
                    (None, None) => {
                        if self.configs.len() >= MAX_CONFIGURATIONS {
                            return Err(TwinError::QuotaExceeded {
                                what: "configurations".into(),
                                max: MAX_CONFIGURATIONS,
                            });
                        }
                        let c = Configuration { spec: spec.clone(), created_ms: at_ms, updated_ms: at_ms, etag };
                        let out = c.render();
                        self.configs.insert(spec.id.clone(), c);
                        self.etag_seq = etag;
                        Ok(out)
                    }
                }
            }
            ConfigOp::Delete { id, if_match } => {
                let c = self.configs.get(id).ok_or_else(|| TwinError::ConfigurationNotFound(id.clone()))?;
                check_etag(c, if_match.as_ref())?;
                self.configs.remove(id);
                self.etag_seq += 1;
                Ok(Value::Null)
            }
        }
    }

    /// Which configuration a twin targeted by `ids` applies, and the marks it should carry: the
    /// highest priority, then the most recently created, then the greatest id.
    pub fn marks(&self, ids: &[String]) -> (Option<&Configuration>, BTreeMap<String, String>) {
        let targeting: Vec<&Configuration> = ids.iter().filter_map(|id| self.configs.get(id)).collect();
        let winner = targeting.iter().copied().max_by(|a, b| {
            (a.spec.priority, a.created_ms, &a.spec.id).cmp(&(b.spec.priority, b.created_ms, &b.spec.id))
        });
        let marks = targeting
            .iter()
            .map(|c| {
                let status = if winner.is_some_and(|w| w.spec.id == c.spec.id) { APPLIED } else { TARGETED };
                (c.spec.id.clone(), status.to_string())
            })
            .collect();
        (winner, marks)
    }
}

impl Configuration {
    /// IoT Hub's Configuration, without metric results (the front door computes those).
    pub fn render(&self) -> Value {
        let s = &self.spec;
        let content: Value = super::json_tree::parse_untrusted(&s.device_content_json).unwrap_or(Value::Null);
        json!({
            "id": s.id,
            "schemaVersion": s.schema_version,
            "labels": s.labels,
            "content": {"deviceContent": content, "modulesContent": {}, "moduleContent": {}},
            "contentType": "assignment",
            "targetCondition": s.target_condition,
            "createdTimeUtc": format_ms(self.created_ms),
            "lastUpdatedTimeUtc": format_ms(self.updated_ms),
            "priority": s.priority,
            "systemMetrics": {"results": {}, "queries": {}},
            "metrics": {"results": {}, "queries": s.metric_queries},
            "etag": etag_text(self.etag),
        })
    }
}

/// The twin's rendering of its marks: `{id: {"status": "Applied" | "Targeted"}}`.
pub fn render_marks(marks: &BTreeMap<String, String>) -> Value {
    Value::Object(marks.iter().map(|(id, status)| (id.clone(), json!({ "status": status }))).collect())
}

/// Validates a `Configuration` body for `id` (the path's). `check_condition` and `check_query` parse
/// the query language (kept outside this pure module).
pub fn parse(
    id: &str,
    doc: &Value,
    check_condition: impl Fn(&str) -> Result<(), String>,
    check_query: impl Fn(&str) -> Result<(), String>,
) -> Result<ConfigSpec, String> {
    let obj = doc.as_object().ok_or("the configuration must be a JSON object")?;
    if let Some(body_id) = obj.get("id").and_then(Value::as_str) {
        if body_id != id {
            return Err(format!("id '{body_id}' in the body differs from '{id}' in the path"));
        }
    }
    let content = obj.get("content").and_then(Value::as_object).ok_or("content.deviceContent is required")?;
    for other in ["moduleContent", "modulesContent"] {
        if content.get(other).and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
            return Err(format!("content.{other} is not supported: only device configurations are"));
        }
    }
    let device_content =
        content.get("deviceContent").and_then(Value::as_object).ok_or("content.deviceContent must be an object")?;
    if device_content.is_empty() {
        return Err("content.deviceContent is empty".into());
    }
    let mut patch = Map::new();
    for (key, value) in device_content {
        let Some(path) = key.strip_prefix("properties.desired.") else {
            return Err(format!("content.deviceContent key '{key}' must start with 'properties.desired.'"));
        };
        let segments: Vec<&str> = path.split('.').collect();
        // Before the path is built (one nesting level per segment, recursively): a flat key of 100,000
        // segments fits in a request body and would nest that deep, past any later depth check.
        if segments.len() > super::validate::MAX_DEPTH {
            let shown: String = key.chars().take(64).collect();
            let more = if shown.len() < key.len() { "…" } else { "" };
            return Err(format!(
                "content.deviceContent key '{shown}{more}' is {} levels deep, over the maximum depth of {}",
                segments.len(),
                super::validate::MAX_DEPTH
            ));
        }
        if segments.iter().any(|s| s.is_empty()) {
            return Err(format!("content.deviceContent key '{key}' has an empty path segment"));
        }
        if !insert_path(&mut patch, &segments, value.clone()) {
            return Err(format!("content.deviceContent key '{key}' overlaps another key"));
        }
    }
    let patch = Value::Object(patch);
    super::validate_twin_patch(&json!({"properties": {"desired": patch}})).map_err(|e| e.to_string())?;
    let target_condition = match obj.get("targetCondition") {
        Some(Value::String(c)) if c.trim() == ALL_DEVICES => ALL_DEVICES.to_string(),
        Some(Value::String(c)) if !c.trim().is_empty() => {
            check_condition(c).map_err(|e| format!("targetCondition: {e}"))?;
            c.clone()
        }
        _ => return Err("targetCondition is required: a WHERE clause over devices, or '*'".into()),
    };
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_i64().filter(|p| *p >= 0).ok_or("priority must be a non-negative integer")?,
    };
    let labels = match obj.get("labels") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())).ok_or(format!("label '{k}' must be a string")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("labels must be an object of strings".into()),
    };
    let mut metric_queries = BTreeMap::new();
    if let Some(q) = obj.get("metrics").and_then(|m| m.get("queries")).filter(|q| !q.is_null()) {
        for (name, text) in q.as_object().ok_or("metrics.queries must be an object")? {
            let text = text.as_str().ok_or(format!("metrics.queries.{name} must be a string"))?;
            check_query(text).map_err(|e| format!("metrics.queries.{name}: {e}"))?;
            metric_queries.insert(name.clone(), text.to_string());
        }
    }
    Ok(ConfigSpec {
        id: id.to_string(),
        schema_version: obj.get("schemaVersion").and_then(Value::as_str).unwrap_or("1.0").to_string(),
        labels,
        device_content_json: Value::Object(device_content.clone()).to_string(),
        desired_patch_json: patch.to_string(),
        target_condition,
        priority,
        metric_queries,
    })
}

/// Sets `value` at `segments` below `target`, creating objects on the way; `false` if the path runs
/// into or over a value another key set.
fn insert_path(target: &mut Map<String, Value>, segments: &[&str], value: Value) -> bool {
    let Some((first, rest)) = segments.split_first() else { return false };
    if rest.is_empty() {
        return target.insert((*first).to_string(), value).is_none();
    }
    match target.entry((*first).to_string()).or_insert_with(|| Value::Object(Map::new())) {
        Value::Object(child) => insert_path(child, rest, value),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(_: &str) -> Result<(), String> {
        Ok(())
    }

    fn spec(id: &str, priority: i64) -> ConfigSpec {
        let body = json!({
            "content": {"deviceContent": {"properties.desired.fw.version": "2.0", "properties.desired.interval": 5}},
            "targetCondition": "tags.site = 'b43'",
            "priority": priority,
        });
        parse(id, &body, ok, ok).unwrap()
    }

    #[test]
    fn a_key_nested_past_the_twin_depth_is_refused_before_it_is_built() {
        let key = |levels: usize| format!("properties.desired.{}", vec!["a"; levels].join("."));
        let body = |levels: usize| json!({"content": {"deviceContent": {key(levels): 1}}, "targetCondition": "*"});
        let deep = parse("c", &body(200_000), ok, ok).unwrap_err();
        assert!(deep.contains("200000 levels deep"), "{deep}");
        assert!(deep.len() < 300, "the error quotes the key in full: {} bytes", deep.len());
        assert!(parse("c", &body(super::super::validate::MAX_DEPTH + 1), ok, ok).is_err());
        parse("c", &body(5), ok, ok).unwrap();
    }

    #[test]
    fn a_hub_holds_at_most_its_quota_of_configurations_and_still_updates_and_deletes_them() {
        let mut s = ConfigsState::default();
        for i in 0..MAX_CONFIGURATIONS {
            s.apply(&ConfigOp::Put { spec: spec(&format!("c{i}"), 1), if_match: None }, 1).unwrap();
        }
        let e = s.apply(&ConfigOp::Put { spec: spec("one-more", 1), if_match: None }, 2).unwrap_err();
        assert_eq!(e, TwinError::QuotaExceeded { what: "configurations".into(), max: MAX_CONFIGURATIONS });
        assert!(!s.configs.contains_key("one-more"));
        s.apply(&ConfigOp::Put { spec: spec("c0", 7), if_match: Some(IfMatch::Any) }, 3).unwrap();
        s.apply(&ConfigOp::Delete { id: "c1".into(), if_match: Some(IfMatch::Any) }, 4).unwrap();
        s.apply(&ConfigOp::Put { spec: spec("one-more", 1), if_match: None }, 5).unwrap();
    }

    #[test]
    fn device_content_paths_become_a_desired_patch() {
        let s = spec("c1", 3);
        assert_eq!(
            serde_json::from_str::<Value>(&s.desired_patch_json).unwrap(),
            json!({"fw": {"version": "2.0"}, "interval": 5})
        );
        assert_eq!((s.priority, s.schema_version.as_str()), (3, "1.0"));
        for (body, says) in [
            (json!({"targetCondition": "*"}), "deviceContent is required"),
            (json!({"content": {"deviceContent": {}}, "targetCondition": "*"}), "empty"),
            (json!({"content": {"deviceContent": {"tags.x": 1}}, "targetCondition": "*"}), "properties.desired."),
            (
                json!({"content": {"deviceContent": {"properties.desired.a": 1, "properties.desired.a.b": 2}}, "targetCondition": "*"}),
                "overlaps",
            ),
            (json!({"content": {"deviceContent": {"properties.desired.a": 1}}}), "targetCondition is required"),
            (
                json!({"content": {"deviceContent": {"properties.desired.a": 1}}, "targetCondition": "*", "priority": -1}),
                "priority",
            ),
            (
                json!({"content": {"deviceContent": {"properties.desired.a": 1}, "moduleContent": {"x": {}}}, "targetCondition": "*"}),
                "moduleContent",
            ),
            (
                json!({"id": "other", "content": {"deviceContent": {"properties.desired.a": 1}}, "targetCondition": "*"}),
                "differs",
            ),
        ] {
            let e = parse("c1", &body, ok, ok).unwrap_err();
            assert!(e.contains(says), "{body}: {e}");
        }
        let bad = parse(
            "c1",
            &json!({"content": {"deviceContent": {"properties.desired.a": 1}}, "targetCondition": "tags."}),
            |_| Err("syntax".into()),
            ok,
        );
        assert!(bad.unwrap_err().contains("targetCondition: syntax"));
    }

    #[test]
    fn records_keep_content_immutable_and_check_etags() {
        let mut st = ConfigsState::default();
        let created = st.apply(&ConfigOp::Put { spec: spec("c1", 1), if_match: None }, 1_000).unwrap();
        assert_eq!(created["etag"], etag_text(1));
        assert!(matches!(
            st.apply(&ConfigOp::Put { spec: spec("c1", 1), if_match: None }, 2_000),
            Err(TwinError::ConfigurationAlreadyExists(_))
        ));
        let stale = Some(IfMatch::Etag("AAAAAAAAAAk=".into()));
        assert!(matches!(
            st.apply(&ConfigOp::Put { spec: spec("c1", 2), if_match: stale.clone() }, 2_000),
            Err(TwinError::PreconditionFailed(_))
        ));
        let updated = st.apply(&ConfigOp::Put { spec: spec("c1", 7), if_match: Some(IfMatch::Any) }, 3_000).unwrap();
        assert_eq!((updated["priority"].as_i64(), updated["etag"].as_str()), (Some(7), Some(etag_text(2).as_str())));
        let mut other_content = spec("c1", 7);
        other_content.device_content_json = "{}".into();
        assert!(matches!(
            st.apply(&ConfigOp::Put { spec: other_content, if_match: Some(IfMatch::Any) }, 4_000),
            Err(TwinError::InvalidArgument(_))
        ));
        assert!(matches!(
            st.apply(&ConfigOp::Put { spec: spec("c2", 1), if_match: Some(IfMatch::Any) }, 4_000),
            Err(TwinError::ConfigurationNotFound(_))
        ));
        assert!(matches!(
            st.apply(&ConfigOp::Delete { id: "c1".into(), if_match: stale }, 5_000),
            Err(TwinError::PreconditionFailed(_))
        ));
        st.apply(&ConfigOp::Delete { id: "c1".into(), if_match: None }, 5_000).unwrap();
        assert!(matches!(
            st.apply(&ConfigOp::Delete { id: "c1".into(), if_match: None }, 6_000),
            Err(TwinError::ConfigurationNotFound(_))
        ));
    }

    #[test]
    fn the_highest_priority_then_the_newest_wins() {
        let mut st = ConfigsState::default();
        st.apply(&ConfigOp::Put { spec: spec("low", 1), if_match: None }, 1_000).unwrap();
        st.apply(&ConfigOp::Put { spec: spec("high", 9), if_match: None }, 2_000).unwrap();
        st.apply(&ConfigOp::Put { spec: spec("high-newer", 9), if_match: None }, 3_000).unwrap();
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (w, marks) = st.marks(&ids(&["low", "high"]));
        assert_eq!(w.map(|c| c.spec.id.as_str()), Some("high"));
        assert_eq!(marks, BTreeMap::from([("high".into(), APPLIED.into()), ("low".into(), TARGETED.into())]));
        let (w, _) = st.marks(&ids(&["low", "high", "high-newer"]));
        assert_eq!(w.map(|c| c.spec.id.as_str()), Some("high-newer"));
        let (w, marks) = st.marks(&ids(&["gone"]));
        assert!(w.is_none() && marks.is_empty());
    }
}
