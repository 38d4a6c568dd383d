//! Numbers. `serde_json` is built with `arbitrary_precision` (twin values keep their exact text), so a
//! `Number` is a string underneath: `1` and `1.0` are different `Value`s. The query language, like
//! IoT Hub's (Cosmos DB-style) engine, treats numbers as one type. Here integers that fit `i64` stay
//! exact; everything else is an `f64`. Results are normalized (an integral float within ±2^53 is
//! written as an integer) so `6 / 2` yields `3`, not `3.0`, and group keys `1` and `1.0` coincide.

use std::cmp::Ordering;

use serde_json::{Number, Value};

/// Largest magnitude up to which every integer is exactly representable as an `f64`.
const EXACT_F64_INT: f64 = 9_007_199_254_740_992.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    I(i64),
    F(f64),
}

impl Num {
    pub fn of(v: &Value) -> Option<Num> {
        let Value::Number(n) = v else { return None };
        Num::parse(n.as_str())
    }

    /// A number from its JSON text, as `serde_json` reads it with `arbitrary_precision` (an integer
    /// that fits `i64`, else a finite `f64`): documents that keep numbers as text compare without
    /// building a `Value`.
    pub fn parse(text: &str) -> Option<Num> {
        if let Ok(i) = text.parse::<i64>() {
            return Some(Num::I(i));
        }
        text.parse::<f64>().ok().filter(|f| f.is_finite()).map(Num::F)
    }

    pub fn f64(self) -> f64 {
        match self {
            Num::I(i) => i as f64,
            Num::F(f) => f,
        }
    }

    pub fn compare(self, other: Num) -> Option<Ordering> {
        match (self, other) {
            (Num::I(a), Num::I(b)) => Some(a.cmp(&b)),
            (a, b) => a.f64().partial_cmp(&b.f64()),
        }
    }

    /// As a JSON value; `None` for NaN/infinity (the language's `undefined`).
    pub fn value(self) -> Option<Value> {
        match self {
            Num::I(i) => Some(Value::from(i)),
            Num::F(f) => float_value(f),
        }
    }
}

/// An `f64` as a normalized JSON number (see the module docs); `None` if not finite.
pub(crate) fn float_value(f: f64) -> Option<Value> {
    if !f.is_finite() {
        return None;
    }
    if f.fract() == 0.0 && f.abs() <= EXACT_F64_INT {
        return Some(Value::from(f as i64));
    }
    Number::from_f64(f).map(Value::Number)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// Binary arithmetic; exact on integers while it fits, `None` on division by zero or overflow to
/// infinity.
pub(crate) fn arith(op: ArithOp, a: Num, b: Num) -> Option<Num> {
    if let (Num::I(x), Num::I(y)) = (a, b) {
        let exact = match op {
            ArithOp::Add => x.checked_add(y),
            ArithOp::Sub => x.checked_sub(y),
            ArithOp::Mul => x.checked_mul(y),
            ArithOp::Div if y == 0 => return None,
            ArithOp::Div => x.checked_rem(y).filter(|r| *r == 0).and_then(|_| x.checked_div(y)),
            ArithOp::Rem if y == 0 => return None,
            ArithOp::Rem => x.checked_rem(y),
        };
        if let Some(r) = exact {
            return Some(Num::I(r));
        }
    }
    let (x, y) = (a.f64(), b.f64());
    let r = match op {
        ArithOp::Add => x + y,
        ArithOp::Sub => x - y,
        ArithOp::Mul => x * y,
        ArithOp::Div if y == 0.0 => return None,
        ArithOp::Div => x / y,
        ArithOp::Rem if y == 0.0 => return None,
        ArithOp::Rem => x % y,
    };
    r.is_finite().then_some(Num::F(r))
}

/// Canonical text of a value, used as a group key: numbers normalized, object members sorted, so
/// that equal values from different documents (or shards) land in the same group.
pub(crate) fn canonical(v: &Value) -> Value {
    match v {
        Value::Number(_) => Num::of(v).and_then(Num::value).unwrap_or_else(|| v.clone()),
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(members.into_iter().map(|(k, v)| (k.clone(), canonical(v))).collect())
        }
        _ => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arithmetic_is_exact_on_integers() {
        assert_eq!(arith(ArithOp::Add, Num::I(2), Num::I(3)), Some(Num::I(5)));
        assert_eq!(arith(ArithOp::Div, Num::I(6), Num::I(2)), Some(Num::I(3)));
        assert_eq!(arith(ArithOp::Div, Num::I(7), Num::I(2)), Some(Num::F(3.5)));
        assert_eq!(arith(ArithOp::Div, Num::I(1), Num::I(0)), None);
        assert_eq!(arith(ArithOp::Rem, Num::I(1), Num::I(0)), None);
        assert_eq!(arith(ArithOp::Rem, Num::I(i64::MIN), Num::I(-1)), Some(Num::F(-0.0)));
        assert_eq!(arith(ArithOp::Mul, Num::I(i64::MAX), Num::I(2)), Some(Num::F(i64::MAX as f64 * 2.0)));
        assert_eq!(arith(ArithOp::Mul, Num::F(1e308), Num::F(10.0)), None);
    }

    #[test]
    fn parsing_text_reads_numbers_as_values_do() {
        for text in ["1", "-0", "1.0", "1e2", "-2.5E-3", "9223372036854775807", "9223372036854775808", "1e400"] {
            // serde_json's own reading of the same text.
            let n: Number = serde_json::from_str(text).unwrap();
            let serde = n.as_i64().map(Num::I).or_else(|| n.as_f64().map(Num::F));
            assert_eq!(Num::parse(text), serde, "{text}");
        }
        assert_eq!(Num::parse("9223372036854775808"), Some(Num::F(9_223_372_036_854_775_808.0)));
        assert_eq!(Num::parse("1e400"), None, "not finite: undefined");
    }

    #[test]
    fn normalization() {
        assert_eq!(float_value(3.0), Some(json!(3)));
        assert_eq!(float_value(f64::NAN), None);
        assert_eq!(Num::of(&json!(1.0)).and_then(Num::value), Some(json!(1)));
        let a: Value = serde_json::from_str("1.0").unwrap();
        let b: Value = serde_json::from_str("1").unwrap();
        assert_ne!(a, b, "arbitrary_precision keeps the text");
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(Num::of(&a).unwrap().compare(Num::of(&b).unwrap()), Some(Ordering::Equal));
        assert_eq!(canonical(&json!({"b":1.0,"a":[2.0]})).to_string(), r#"{"a":[2],"b":1}"#);
    }
}
