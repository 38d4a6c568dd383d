//! Etags: base64 of an 8-byte big-endian counter, the form IoT Hub's twin etags take (`AAAAAAAAAAc=` is 7).
//! The counter is shard-wide and only grows, so an etag is never reused, even after a device is deleted
//! and created again, and a stale If-Match can never match by accident. It is never `*`.

use base64::Engine;

pub fn etag_text(counter: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(counter.to_be_bytes())
}

/// [`etag_text`] as a value serde writes without a `String` of its own (a twin document carries two).
#[derive(Clone, Copy, Debug)]
pub struct Etag(pub u64);

impl Etag {
    /// The etag's text: eight bytes are always twelve base64 characters, padding included, none of
    /// which a JSON string escapes.
    fn text(self) -> ([u8; 12], usize) {
        let mut text = [0u8; 12];
        let n = base64::engine::general_purpose::STANDARD.encode_slice(self.0.to_be_bytes(), &mut text).unwrap_or(0);
        (text, n)
    }

    /// The etag as a JSON string, the bytes serde_json writes for it, without a serializer.
    pub fn write_json(self, out: &mut Vec<u8>) {
        let (text, n) = self.text();
        out.push(b'"');
        out.extend_from_slice(&text[..n]);
        out.push(b'"');
    }
}

impl serde::Serialize for Etag {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (text, n) = self.text();
        s.serialize_str(std::str::from_utf8(&text[..n]).unwrap_or_default())
    }
}

/// The counter of an etag, or `None` for text that is no etag of ours (which can never match).
pub fn etag_counter(text: &str) -> Option<u64> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).ok()?;
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_is_base64_of_big_endian_counter() {
        assert_eq!(etag_text(7), "AAAAAAAAAAc=");
        assert_eq!(etag_text(1), "AAAAAAAAAAE=");
        assert_ne!(etag_text(0), "*");
        assert_eq!(etag_counter("AAAAAAAAAAc="), Some(7));
        assert_eq!(etag_counter("AAAA"), None);
        assert_eq!(etag_counter("not base64!"), None);
        for counter in [0, 1, 7, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(serde_json::to_string(&Etag(counter)).ok(), Some(format!("\"{}\"", etag_text(counter))));
            let mut written = Vec::new();
            Etag(counter).write_json(&mut written);
            assert_eq!(serde_json::to_vec(&Etag(counter)).ok(), Some(written));
        }
    }
}
