//! Limits and key rules of twin documents, with the newest developer guide's values (where the seeds
//! differ, the newest wins): keys ≤ 1 KB, strings ≤ 4 KB, integers in ±2^52, depth ≤ 10, tags ≤ 8 KB,
//! desired and reported ≤ 32 KB each.
//!
//! Choices made precise here:
//! - **KB** is 1024. Key and string limits count UTF-8 bytes.
//! - **Depth**: the section object (`tags`, `properties.desired`, `properties.reported`) is level 0; a
//!   container (object or array) that is a member's value is one level below its parent. Containers may
//!   reach level 10, so the guide's example `tags.one.two…ten.property` is the deepest valid shape.
//! - **Size**, as the guide says, counts every character of the document's JSON text except control
//!   characters (C0, C1) and spaces outside strings: the compact text, with strings counted by their
//!   characters (not their escapes), control characters not counted. `$metadata` and `$version` are not
//!   part of a section. Members whose value is `null` in a patch are removals and do not count.
//! - Arrays are accepted; their elements are checked like any value (strings, numbers, nested objects'
//!   keys), and an array counts as a level of depth.

use super::error::TwinError;
use super::json_tree::{self, Json, Members};

pub const MAX_KEY_BYTES: usize = 1024;
pub const MAX_STRING_BYTES: usize = 4096;
pub const MAX_DEPTH: usize = 10;
pub const MAX_TAGS_SIZE: usize = 8 * 1024;
pub const MAX_DESIRED_SIZE: usize = 32 * 1024;
pub const MAX_REPORTED_SIZE: usize = 32 * 1024;
pub const MIN_INTEGER: i128 = -4_503_599_627_370_496;
pub const MAX_INTEGER: i128 = 4_503_599_627_370_495;

/// Identity members the SDKs send back inside twin bodies (they serialise a whole Twin object). They
/// are not writable through the twin API, so they are accepted and ignored.
const IGNORED_MEMBERS: &[&str] = &[
    "deviceId",
    "moduleId",
    "etag",
    "deviceEtag",
    "version",
    "status",
    "statusReason",
    "statusUpdateTime",
    "statusUpdatedTime",
    "connectionState",
    "connectionStateUpdatedTime",
    "lastActivityTime",
    "cloudToDeviceMessageCount",
    "authenticationType",
    "x509Thumbprint",
    "modelId",
    "capabilities",
    "deviceScope",
    "parentScopes",
    "generationId",
    "managedBy",
];

/// A section of a service body.
#[derive(Clone, Copy, Debug)]
pub enum Section<'a> {
    Absent,
    /// `"tags": null` / `"desired": null`: clear the whole section.
    Null,
    Object(&'a Members<'a>),
}

/// The parts of a service twin body that write anything.
#[derive(Clone, Copy, Debug)]
pub struct ServiceBody<'a> {
    pub tags: Section<'a>,
    pub desired: Section<'a>,
}

/// Parses the text of a command's JSON body (as untrusted text: see [`json_tree::parse_untrusted`]).
pub fn parse_json(text: &str) -> Result<serde_json::Value, TwinError> {
    json_tree::parse_untrusted(text).map_err(malformed)
}

/// Parses the text of a command's JSON body into a tree that borrows from it (see `json_tree`): as
/// [`parse_json`] reads it, with its errors.
pub fn parse_tree(text: &str) -> Result<Json<'_>, TwinError> {
    json_tree::parse(text).map_err(malformed)
}

fn malformed(e: serde_json::Error) -> TwinError {
    TwinError::InvalidArgument(format!("malformed JSON body: {e}"))
}

/// Splits and fully validates a service PATCH or PUT body. The two differ only in
/// what a missing or null section means, which the caller decides; the rules checked are the same.
/// (`validate_text::check_service_text` checks the same rules on the text, in the same order.)
pub fn service_body<'a>(body: &'a Json<'a>) -> Result<ServiceBody<'a>, TwinError> {
    let Json::Object(top) = body else {
        return Err(BodyRule::NotAnObject.into());
    };
    BodyRule::unknown_members(top.keys().filter(|k| !is_body_member(k)))?;
    let tags = section(top.get("tags"), "tags")?;
    let mut desired = Section::Absent;
    match top.get("properties") {
        None | Some(Json::Null) => {}
        Some(Json::Object(props)) => {
            BodyRule::unknown_properties(props.keys().filter(|k| !is_properties_member(k)))?;
            match props.get("reported") {
                None | Some(Json::Null) => {}
                Some(Json::Object(r)) if r.is_empty() => {}
                Some(_) => return Err(BodyRule::ReportedByService.into()),
            }
            desired = section(props.get("desired"), "properties.desired")?;
        }
        Some(_) => return Err(BodyRule::PropertiesNotAnObject.into()),
    }
    check_sections(tags, desired)?;
    Ok(ServiceBody { tags, desired })
}

/// A member a service body may hold at its top: its two sections, or one the SDKs send back and we
/// ignore.
pub(super) fn is_body_member(key: &str) -> bool {
    matches!(key, "tags" | "properties") || IGNORED_MEMBERS.contains(&key)
}

pub(super) fn is_properties_member(key: &str) -> bool {
    matches!(key, "desired" | "reported")
}

/// The rules of a service body's shape (its sections' contents are [`check_section`]'s), each with
/// its message: the tree's check and the text's give the same ones.
#[derive(Clone, Copy, Debug)]
pub(super) enum BodyRule<'a> {
    NotAnObject,
    PropertiesNotAnObject,
    ReportedByService,
    SectionNotAnObject(&'a str),
}

impl BodyRule<'_> {
    /// An error naming every member given that a body may not hold, if there is one.
    pub(super) fn unknown_members<'k>(keys: impl Iterator<Item = &'k str>) -> Result<(), TwinError> {
        unknown("unknown twin member(s)", keys)
    }

    pub(super) fn unknown_properties<'k>(keys: impl Iterator<Item = &'k str>) -> Result<(), TwinError> {
        unknown("unknown member(s) of properties", keys)
    }
}

fn unknown<'k>(what: &str, keys: impl Iterator<Item = &'k str>) -> Result<(), TwinError> {
    let unknown: Vec<&str> = keys.collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(invalid(&format!("{what}: {}", unknown.join(", "))))
}

impl From<BodyRule<'_>> for TwinError {
    fn from(rule: BodyRule<'_>) -> TwinError {
        match rule {
            BodyRule::NotAnObject => invalid("the twin body must be a JSON object"),
            BodyRule::PropertiesNotAnObject => invalid("properties must be a JSON object"),
            BodyRule::ReportedByService => {
                invalid("properties.reported cannot be written by the service; only the device updates it")
            }
            BodyRule::SectionNotAnObject(path) => invalid(&format!("{path} must be a JSON object or null")),
        }
    }
}

/// Validates a device's reported patch and returns its members.
pub fn reported_body<'a>(body: &'a Json<'a>) -> Result<&'a Members<'a>, TwinError> {
    let Json::Object(m) = body else {
        return Err(invalid("the reported properties patch must be a JSON object"));
    };
    check_section(Section::Object(m), "properties.reported", MAX_REPORTED_SIZE)?;
    Ok(m)
}

fn section<'a>(v: Option<&'a Json<'a>>, path: &str) -> Result<Section<'a>, TwinError> {
    match v {
        None => Ok(Section::Absent),
        Some(Json::Null) => Ok(Section::Null),
        Some(Json::Object(m)) => Ok(Section::Object(m)),
        Some(_) => Err(BodyRule::SectionNotAnObject(path).into()),
    }
}

/// [`check_section`] for the two sections a service body writes, each against its own limit.
pub(super) fn check_sections(tags: Section<'_>, desired: Section<'_>) -> Result<(), TwinError> {
    check_section(tags, "tags", MAX_TAGS_SIZE)?;
    check_section(desired, "properties.desired", MAX_DESIRED_SIZE)
}

/// Keys, values and depth of a section, and its size. For a patch, the size checked is that of the
/// patch without its removals: the merged result contains all of it, so a patch over the limit can only
/// give a result over the limit (apply checks the merged result itself).
fn check_section(s: Section<'_>, path: &str, limit: usize) -> Result<(), TwinError> {
    let Section::Object(m) = s else { return Ok(()) };
    check_members(m, Path::Root(path), 0)?;
    check_size(path, map_size(m), limit)
}

pub fn check_size(path: &str, size: usize, limit: usize) -> Result<(), TwinError> {
    if size > limit {
        return Err(invalid(&format!(
            "{path} has size {size}, over the limit of {limit} ({} KB; characters of its JSON text, \
             $metadata and $version excluded)",
            limit / 1024
        )));
    }
    Ok(())
}

/// Where in a document a check is, spelled out only when a check fails: every member of every write
/// passes through here, and most writes are valid.
#[derive(Clone, Copy)]
pub(super) enum Path<'a> {
    Root(&'a str),
    Member(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root(p) => f.write_str(p),
            Path::Member(parent, k) => write!(f, "{parent}.{k}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

fn check_members(m: &Members<'_>, path: Path<'_>, level: usize) -> Result<(), TwinError> {
    for (k, v) in m.iter() {
        check_key(path, k)?;
        check_value(v, Path::Member(&path, k), level + 1)?;
    }
    Ok(())
}

pub(super) fn check_key(path: Path<'_>, key: &str) -> Result<(), TwinError> {
    if key.is_empty() {
        return Err(invalid(&format!("empty key in {path}")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(invalid(&format!("key in {path} is {} bytes, over the limit of {MAX_KEY_BYTES} bytes", key.len())));
    }
    if let Some(c) = key.chars().find(|c| c.is_control() || matches!(c, '.' | '$' | ' ')) {
        return Err(invalid(&format!(
            "key {:?} in {path} contains {:?}; keys cannot contain control characters, '.', '$' or space",
            key, c
        )));
    }
    Ok(())
}

/// `level` is the level a container at `path` would have.
fn check_value(v: &Json<'_>, path: Path<'_>, level: usize) -> Result<(), TwinError> {
    match v {
        Json::Null | Json::Bool(_) => Ok(()),
        // Numbers keep their JSON text (serde_json's `arbitrary_precision`), so it is read, not rendered.
        // An integer read as one is checked as the number it is, not as its text.
        Json::U64(_) | Json::I64(_) => match v.integer() {
            Some(i) if (MIN_INTEGER..=MAX_INTEGER).contains(&i) => Ok(()),
            _ => Err(out_of_range(path)),
        },
        Json::Number(n) => check_number_text(n.as_str(), path),
        Json::String(s) if s.len() > MAX_STRING_BYTES => {
            Err(invalid(&format!("string at {path} is {} bytes, over the limit of {MAX_STRING_BYTES} bytes", s.len())))
        }
        Json::String(_) => Ok(()),
        Json::Object(m) => {
            check_level(path, level)?;
            check_members(m, path, level)
        }
        Json::Array(items) => {
            check_level(path, level)?;
            items.iter().enumerate().try_for_each(|(i, item)| check_value(item, Path::Index(&path, i), level + 1))
        }
    }
}

pub(super) fn check_level(path: Path<'_>, level: usize) -> Result<(), TwinError> {
    if level > MAX_DEPTH {
        return Err(invalid(&format!("{path} is nested {level} levels deep, over the maximum depth of {MAX_DEPTH}")));
    }
    Ok(())
}

/// Checks a number's JSON text.
pub(super) fn check_number_text(text: &str, path: Path<'_>) -> Result<(), TwinError> {
    if text.contains(['.', 'e', 'E']) {
        return match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(()),
            _ => Err(invalid(&format!("number at {path} is out of range"))),
        };
    }
    match text.parse::<i128>() {
        Ok(i) if (MIN_INTEGER..=MAX_INTEGER).contains(&i) => Ok(()),
        _ => Err(out_of_range(path)),
    }
}

fn out_of_range(path: Path<'_>) -> TwinError {
    invalid(&format!("integer at {path} is outside the allowed range [{MIN_INTEGER}, {MAX_INTEGER}]"))
}

/// Characters of a string as it counts in a size: its characters plus two quotes, control characters
/// not counted.
pub fn text_size(s: &str) -> usize {
    ascii_text_size(s.as_bytes()).unwrap_or_else(|| 2 + s.chars().filter(|c| !c.is_control()).count())
}

/// [`text_size`] of ASCII text, counted by bytes (the only ASCII control characters are U+0000–U+001F
/// and U+007F); `None` for other text. Every write measures every string it carries and each section
/// it merged, on every replica: nearly all of them ASCII without a control character, which a test a
/// word at a time finds before anything is counted (counted byte by byte, most of the size of a merged
/// section, benches/README.md).
pub fn ascii_text_size(bytes: &[u8]) -> Option<usize> {
    if !bytes.is_ascii() {
        return None;
    }
    let controls =
        if super::scan::has_control(bytes) { bytes.iter().filter(|b| b.is_ascii_control()).count() } else { 0 };
    Some(2 + bytes.len() - controls)
}

/// Size of a JSON document as defined in the module doc (null members of objects count).
pub fn doc_size(v: &Json<'_>) -> usize {
    match v {
        Json::Null => 4,
        Json::Bool(true) => 4,
        Json::Bool(false) => 5,
        Json::U64(_) | Json::I64(_) | Json::Number(_) => v.number_len().unwrap_or(0),
        Json::String(s) => text_size(s),
        Json::Array(items) => 2 + items.len().saturating_sub(1) + items.iter().map(doc_size).sum::<usize>(),
        Json::Object(m) => {
            2 + m.len().saturating_sub(1) + m.iter().map(|(k, v)| text_size(k) + 1 + doc_size(v)).sum::<usize>()
        }
    }
}

/// Size of an object patch without its removals (members whose value is `null`, at any level).
pub fn map_size(m: &Members<'_>) -> usize {
    let (mut kept, mut members) = (0usize, 0usize);
    for (k, v) in m.iter().filter(|(_, v)| !v.is_null()) {
        kept += 1;
        members += text_size(k)
            + 1
            + match v {
                Json::Object(inner) => map_size(inner),
                other => doc_size(other),
            };
    }
    2 + kept.saturating_sub(1) + members
}

fn invalid(msg: &str) -> TwinError {
    TwinError::InvalidArgument(msg.to_string())
}

/// Device and module ids: ≤ 128 ASCII alphanumerics plus `- : . + % _ # * ? ! ( ) , = @ ; $ '`.
pub fn validate_id(kind: &str, id: &str) -> Result<(), TwinError> {
    const MAX_ID: usize = 128;
    const EXTRA: &str = "-:.+%_#*?!(),=@;$'";
    if id.is_empty() {
        return Err(invalid(&format!("{kind} id is empty")));
    }
    if id.len() > MAX_ID {
        return Err(invalid(&format!("{kind} id is {} characters, over the limit of {MAX_ID}", id.len())));
    }
    if let Some(c) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || EXTRA.contains(*c))) {
        return Err(invalid(&format!(
            "{kind} id {id:?} contains {c:?}; allowed are ASCII letters, digits and {EXTRA}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_size_counts_ascii_by_bytes_as_it_counts_chars() {
        for s in ["", "abc", "a\u{0}b\u{1f}c\u{7f}", "tab\there\n", "é", "a\u{80}\u{9f}b", "日本\u{7}"] {
            assert_eq!(text_size(s), 2 + s.chars().filter(|c| !c.is_control()).count(), "{s:?}");
        }
    }
}
