//! Tests of every byte of a text, eight bytes at a time in a machine word.
//!
//! Every twin write checks the strings it renders for bytes JSON escapes and measures the strings of
//! the sections it merged, on every replica; nearly all are short and plain. Byte by byte (or by a
//! fold the compiler vectorizes, whose tail is byte by byte), a twelve-byte name cost over a hundred
//! instructions; as two words, about twenty (benches/README.md).

/// A word with each byte 1.
const ONES: u64 = u64::from_le_bytes([1; 8]);

/// The high bit of each byte.
const HIGH: u64 = ONES * 0x80;

/// Marks (sets the high bit of) a byte of `word` below `n` (at most 0x80). The classic test (subtract
/// `n` from every byte; a byte that borrows and had its high bit clear was below it) may also mark the
/// byte after one that was, never a word without one: callers only ask whether any byte is marked.
fn below(word: u64, n: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH
}

/// Marks a byte of `word` equal to `b`.
fn equal(word: u64, b: u8) -> u64 {
    below(word ^ (ONES * u64::from(b)), 1)
}

/// Whether `test` marks a word of `text`, its last few bytes padded with a byte no test here marks.
fn any_word(text: &[u8], test: impl Fn(u64) -> u64) -> bool {
    let mut words = text.chunks_exact(8);
    let mut found = 0;
    for word in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        found |= test(u64::from_le_bytes(bytes));
    }
    let rest = words.remainder();
    let mut bytes = [b'a'; 8];
    bytes[..rest.len()].copy_from_slice(rest);
    found |= test(u64::from_le_bytes(bytes));
    found != 0
}

/// Whether `text` has a byte a JSON string must escape: a control character, a quote or a backslash.
/// Texts of 32 bytes and more are read by a fold without an early exit, which vectorizes and then
/// reads 16 bytes a step; shorter ones a word at a time. Bytes of multi-byte UTF-8 characters (0x80
/// and up) are never taken for any of these.
pub fn needs_escape(text: &[u8]) -> bool {
    if text.len() >= 32 {
        return text.iter().fold(false, |escape, &b| escape | (b < 0x20) | (b == b'"') | (b == b'\\'));
    }
    any_word(text, |w| below(w, 0x20) | equal(w, b'"') | equal(w, b'\\'))
}

/// Whether `text` has an ASCII control character (U+0000–U+001F, U+007F); long texts by a fold, as
/// [`needs_escape`] reads them.
pub fn has_control(text: &[u8]) -> bool {
    if text.len() >= 32 {
        return text.iter().fold(false, |control, &b| control | (b < 0x20) | (b == 0x7f));
    }
    any_word(text, |w| below(w, 0x20) | equal(w, 0x7f))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each test against its rule byte by byte: every byte value at every position of texts of every
    /// length around the words' and the fold's edges, in a text otherwise plain and in ones whose other
    /// bytes are all high (0x80 and up, never to be taken for what is tested) or at the rules' edges.
    #[test]
    fn word_tests_find_exactly_the_bytes_their_rules_name() {
        let escape = |t: &[u8]| t.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
        let control = |t: &[u8]| t.iter().any(u8::is_ascii_control);
        for len in 1..40 {
            for filler in [b'x', 0x80, 0xff, b'~', 0x20, 0x21, 0x7e] {
                let mut text = vec![filler; len];
                for at in 0..len {
                    for b in 0..=255u8 {
                        text[at] = b;
                        let case = format!("len {len}, {b:#x} at {at} among {filler:#x}");
                        assert_eq!(needs_escape(&text), escape(&text), "escape: {case}");
                        assert_eq!(has_control(&text), control(&text), "control: {case}");
                    }
                    text[at] = filler;
                }
            }
        }
        assert!(!needs_escape(b"") && !has_control(b""));
    }
}
