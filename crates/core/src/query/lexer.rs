//! Tokenizer. Works on `char`s so that error positions are character offsets, as users count them.
//!
//! Keywords are not distinguished here: they are identifiers the parser compares case-insensitively,
//! which lets a keyword still be used as a property name after a dot (`tags.group`). A property whose
//! name is a keyword at the *start* of a path is written `[[group]]`, the escape IoT Hub documents.

use serde_json::Value;

use super::error::QueryError;
use super::num;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// A bare word: keyword, function name, collection, alias or property name.
    Ident(String),
    /// `[[name]]`: always a property name, never a keyword.
    Quoted(String),
    Str(String),
    /// A numeric literal, already normalized (integers stay exact).
    Num(Value),
    Star,
    Comma,
    Dot,
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Colon,
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
    Plus,
    Minus,
    Slash,
    Percent,
    Eof,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub tok: Tok,
    /// 1-based character offset of the token's first character.
    pub pos: usize,
    /// The source text of the token, for error messages.
    pub text: String,
}

impl Token {
    /// How the token is quoted in "found ..." messages.
    pub fn describe(&self) -> String {
        match self.tok {
            Tok::Eof => "end of input".to_string(),
            _ => format!("'{}'", self.text),
        }
    }

    /// Is this the (case-insensitive) keyword `kw`? Quoted identifiers never are.
    pub fn is_kw(&self, kw: &str) -> bool {
        matches!(&self.tok, Tok::Ident(s) if s.eq_ignore_ascii_case(kw))
    }
}

fn ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_' || c == '$'
}

fn ident_continue(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

/// Characters allowed between `[[` and `]]`. Excluding separators keeps `[[1, 2]]` an array of arrays.
fn quoted_ident_char(c: char) -> bool {
    !(c.is_whitespace() || matches!(c, '[' | ']' | ',' | '\'' | '"' | '(' | ')'))
}

pub(crate) fn lex(src: &str) -> Result<Vec<Token>, QueryError> {
    let chars: Vec<char> = src.chars().collect();
    let mut lx = Lexer { chars: &chars, i: 0, out: Vec::new() };
    lx.run()?;
    Ok(lx.out)
}

struct Lexer<'a> {
    chars: &'a [char],
    i: usize,
    out: Vec<Token>,
}

impl Lexer<'_> {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).copied()
    }

    fn text(&self, start: usize) -> String {
        self.chars.get(start..self.i).map(|s| s.iter().collect()).unwrap_or_default()
    }

    fn push(&mut self, tok: Tok, start: usize) {
        let text = self.text(start);
        self.out.push(Token { tok, pos: start + 1, text });
    }

    fn run(&mut self) -> Result<(), QueryError> {
        while let Some(c) = self.peek(0) {
            let start = self.i;
            if c.is_whitespace() {
                self.i += 1;
                continue;
            }
            if ident_start(c) {
                while self.peek(0).is_some_and(ident_continue) {
                    self.i += 1;
                }
                let t = self.text(start);
                self.push(Tok::Ident(t), start);
                continue;
            }
            if c.is_ascii_digit() {
                let v = self.number()?;
                self.push(Tok::Num(v), start);
                continue;
            }
            if c == '\'' || c == '"' {
                let s = self.string(c)?;
                self.push(Tok::Str(s), start);
                continue;
            }
            if c == '[' && self.peek(1) == Some('[') {
                if let Some(name) = self.quoted_ident() {
                    self.push(Tok::Quoted(name), start);
                    continue;
                }
            }
            let two = |a: char, b: char| c == a && self.peek(1) == Some(b);
            let (tok, len) = if two('<', '>') || two('!', '=') {
                (Tok::Ne, 2)
            } else if two('<', '=') {
                (Tok::Le, 2)
            } else if two('>', '=') {
                (Tok::Ge, 2)
            } else {
                let t = match c {
                    '*' => Tok::Star,
                    ',' => Tok::Comma,
                    '.' => Tok::Dot,
                    '(' => Tok::LParen,
                    ')' => Tok::RParen,
                    '[' => Tok::LBracket,
                    ']' => Tok::RBracket,
                    '{' => Tok::LBrace,
                    '}' => Tok::RBrace,
                    ':' => Tok::Colon,
                    '=' => Tok::Eq,
                    '<' => Tok::Lt,
                    '>' => Tok::Gt,
                    '+' => Tok::Plus,
                    '-' => Tok::Minus,
                    '/' => Tok::Slash,
                    '%' => Tok::Percent,
                    _ => return Err(QueryError::new(start + 1, format!("unexpected character '{c}'"))),
                };
                (t, 1)
            };
            self.i += len;
            self.push(tok, start);
        }
        self.out.push(Token { tok: Tok::Eof, pos: self.chars.len() + 1, text: String::new() });
        Ok(())
    }

    /// `[[name]]` starting at `self.i`; `None` (nothing consumed) if it is not one, so the caller lexes
    /// two `[` instead (a nested array).
    fn quoted_ident(&mut self) -> Option<String> {
        let mut j = self.i + 2;
        while self.chars.get(j).copied().is_some_and(quoted_ident_char) {
            j += 1;
        }
        let closed = self.chars.get(j) == Some(&']') && self.chars.get(j + 1) == Some(&']');
        if !closed || j == self.i + 2 {
            return None;
        }
        let name: String = self.chars.get(self.i + 2..j)?.iter().collect();
        self.i = j + 2;
        Some(name)
    }

    fn number(&mut self) -> Result<Value, QueryError> {
        let start = self.i;
        let bad = |msg: &str| QueryError::new(start + 1, msg.to_string());
        if self.peek(0) == Some('0') && matches!(self.peek(1), Some('x' | 'X')) {
            self.i += 2;
            let mut v: u64 = 0;
            let mut digits = 0usize;
            while let Some(d) = self.peek(0).and_then(|c| c.to_digit(16)) {
                v = v
                    .checked_mul(16)
                    .and_then(|v| v.checked_add(u64::from(d)))
                    .ok_or_else(|| bad("hexadecimal number too large"))?;
                digits += 1;
                self.i += 1;
            }
            if digits == 0 || self.peek(0).is_some_and(ident_continue) {
                return Err(bad("invalid hexadecimal number"));
            }
            return Ok(Value::from(v));
        }
        let mut integral = true;
        self.digits();
        if self.peek(0) == Some('.') && self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
            integral = false;
            self.i += 1;
            self.digits();
        }
        if matches!(self.peek(0), Some('e' | 'E')) {
            let signed = matches!(self.peek(1), Some('+' | '-'));
            let first = if signed { self.peek(2) } else { self.peek(1) };
            if first.is_some_and(|c| c.is_ascii_digit()) {
                integral = false;
                self.i += if signed { 2 } else { 1 };
                self.digits();
            }
        }
        if self.peek(0).is_some_and(ident_continue) {
            return Err(bad("invalid number"));
        }
        let text = self.text(start);
        if integral {
            if let Ok(i) = text.parse::<i64>() {
                return Ok(Value::from(i));
            }
        }
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => num::float_value(f).ok_or_else(|| bad("number out of range")),
            _ => Err(bad("number out of range")),
        }
    }

    fn digits(&mut self) {
        while self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }

    fn string(&mut self, quote: char) -> Result<String, QueryError> {
        let start = self.i;
        self.i += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek(0) else {
                return Err(QueryError::new(start + 1, "unterminated string"));
            };
            self.i += 1;
            if c == quote {
                return Ok(out);
            }
            if c != '\\' {
                out.push(c);
                continue;
            }
            let esc_pos = self.i; // 1-based position of the backslash
            let Some(e) = self.peek(0) else {
                return Err(QueryError::new(start + 1, "unterminated string"));
            };
            self.i += 1;
            let decoded = match e {
                '\'' | '"' | '\\' | '/' => e,
                'b' => '\u{8}',
                'f' => '\u{c}',
                'n' => '\n',
                'r' => '\r',
                't' => '\t',
                'u' => self.unicode_escape(esc_pos)?,
                _ => return Err(QueryError::new(esc_pos, format!("invalid escape sequence '\\{e}'"))),
            };
            out.push(decoded);
        }
    }

    /// After `\u`: four hex digits, combining a UTF-16 surrogate pair written as two escapes.
    fn unicode_escape(&mut self, esc_pos: usize) -> Result<char, QueryError> {
        let bad = || QueryError::new(esc_pos, "invalid \\u escape");
        let hi = self.hex4().ok_or_else(bad)?;
        if (0xD800..0xDC00).contains(&hi) {
            if self.peek(0) == Some('\\') && self.peek(1) == Some('u') {
                self.i += 2;
                let lo = self.hex4().ok_or_else(bad)?;
                if (0xDC00..0xE000).contains(&lo) {
                    let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                    return char::from_u32(cp).ok_or_else(bad);
                }
            }
            return Err(bad());
        }
        char::from_u32(hi).ok_or_else(bad)
    }

    fn hex4(&mut self) -> Option<u32> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = self.peek(0)?.to_digit(16)?;
            v = v * 16 + d;
            self.i += 1;
        }
        Some(v)
    }
}

/// `s` as a single-quoted string literal of the query language: backslashes and quotes escaped, so
/// any text (ids may contain `'`) reads back as exactly itself and never as query syntax.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\\' || c == '\'' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn quoted_text_reads_back_as_itself() {
        for s in ["job1", "o'brien", "x' OR 1=1 OR jobId = 'y", "back\\slash\\", "", "\"dq\""] {
            assert_eq!(toks(&quote(s)), vec![Tok::Str(s.to_string()), Tok::Eof], "{s}");
        }
    }

    #[test]
    fn operators_and_positions() {
        let t = lex("a<>b != c <= >= < > = ").unwrap();
        let kinds: Vec<_> = t.iter().map(|t| t.tok.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                Tok::Ident("a".into()),
                Tok::Ne,
                Tok::Ident("b".into()),
                Tok::Ne,
                Tok::Ident("c".into()),
                Tok::Le,
                Tok::Ge,
                Tok::Lt,
                Tok::Gt,
                Tok::Eq,
                Tok::Eof
            ]
        );
        assert_eq!(t[1].pos, 2);
        assert_eq!(t[3].pos, 6);
        assert_eq!(t.last().unwrap().pos, 23);
    }

    #[test]
    fn numbers() {
        assert_eq!(toks("0x1F")[0], Tok::Num(Value::from(31)));
        assert_eq!(toks("42")[0], Tok::Num(Value::from(42)));
        assert_eq!(toks("1.5e2")[0], Tok::Num(Value::from(150)));
        assert_eq!(toks("2.5")[0], Tok::Num(serde_json::json!(2.5)));
        assert_eq!(toks("18446744073709551616")[0], Tok::Num(serde_json::json!(1.8446744073709552e19)));
        assert!(lex("1e999").is_err());
        assert!(lex("0x").is_err());
        assert!(lex("0xFFFFFFFFFFFFFFFFF").is_err());
        assert!(lex("12abc").is_err());
    }

    #[test]
    fn strings_and_escapes() {
        assert_eq!(
            toks(r#"'it\'s' "q\"" '\u00e9\uD83D\uDE00\n'"#)[..3],
            [Tok::Str("it's".into()), Tok::Str("q\"".into()), Tok::Str("é😀\n".into())]
        );
        assert_eq!(lex("'abc").unwrap_err().position, 1);
        assert_eq!(lex("x = 'a\\qb'").unwrap_err().position, 7);
        assert!(lex(r"'\uD800'").is_err());
        assert!(lex(r"'\u12'").is_err());
    }

    #[test]
    fn quoted_identifiers() {
        assert_eq!(toks("tags.[[group]].x")[2], Tok::Quoted("group".into()));
        assert_eq!(toks("[[1, 2]]")[0], Tok::LBracket);
        assert_eq!(toks("[[]]")[0], Tok::LBracket);
    }

    #[test]
    fn positions_count_characters_not_bytes() {
        let t = lex("'ééé' ?").unwrap_err();
        assert_eq!(t.position, 7);
    }
}
