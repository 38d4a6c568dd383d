//! JSON text written straight, the bytes serde_json writes, for the renderings every twin write makes
//! on every replica (the twin it answers, its change event): through a serializer, each string was
//! checked for escapes byte by byte and each name went through the generic map machinery.

use super::scan::needs_escape;

/// `text` as a JSON string, escaped as serde_json escapes it. Nearly all names and values need no
/// escape, which [`needs_escape`] finds; the rest go through serde_json itself.
pub fn write_json_str(out: &mut Vec<u8>, text: &[u8]) {
    if !needs_escape(text) {
        out.push(b'"');
        out.extend_from_slice(text);
        out.push(b'"');
    } else {
        let text = std::str::from_utf8(text).unwrap_or_default();
        let _ = serde_json::to_writer(&mut *out, text); // cannot fail: a string into a vector
    }
}

/// An integer as serde_json writes it.
pub fn write_json_int(out: &mut Vec<u8>, n: i64) {
    let _ = serde_json::to_writer(&mut *out, &n); // cannot fail: an integer into a vector
}

/// `"name":`, after a comma unless it is an object's first member.
pub fn write_key(out: &mut Vec<u8>, first: &mut bool, name: &[u8]) {
    if !std::mem::take(first) {
        out.push(b',');
    }
    write_json_str(out, name);
    out.push(b':');
}
