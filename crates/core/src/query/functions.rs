//! Scalar functions. Arity is checked by the parser; every function returns `undefined` for
//! arguments of the wrong type instead of failing the query (Cosmos DB behaviour). String positions
//! and lengths count Unicode scalar values.

use std::borrow::Cow;

use serde_json::Value;

use super::ast::Func;
use super::eval::{is_primitive, Val};
use super::num::{self, ArithOp, Num};

fn boolean<'a>(b: bool) -> Val<'a> {
    Some(Cow::Owned(Value::Bool(b)))
}

fn string<'a>(s: String) -> Val<'a> {
    Some(Cow::Owned(Value::String(s)))
}

fn number<'a>(n: Option<Num>) -> Val<'a> {
    n.and_then(Num::value).map(Cow::Owned)
}

fn float<'a>(f: f64) -> Val<'a> {
    num::float_value(f).map(Cow::Owned)
}

fn arg<'v>(args: &'v [Val<'_>], i: usize) -> Option<&'v Value> {
    args.get(i).and_then(|v| v.as_deref())
}

fn str_arg<'v>(args: &'v [Val<'_>], i: usize) -> Option<&'v str> {
    arg(args, i).and_then(Value::as_str)
}

fn num_arg(args: &[Val<'_>], i: usize) -> Option<Num> {
    arg(args, i).and_then(Num::of)
}

/// Type test on the first argument; `undefined` is of no type (false), as in Cosmos DB.
fn is<'a>(args: &[Val<'_>], pred: fn(&Value) -> bool) -> Val<'a> {
    boolean(arg(args, 0).is_some_and(pred))
}

pub(crate) fn call<'a>(f: Func, args: Vec<Val<'a>>) -> Val<'a> {
    use Func::*;
    match f {
        IsDefined => boolean(arg(&args, 0).is_some()),
        IsNull => is(&args, Value::is_null),
        IsBool => is(&args, Value::is_boolean),
        IsNumber => is(&args, Value::is_number),
        IsString => is(&args, Value::is_string),
        IsObject => is(&args, Value::is_object),
        IsArray => is(&args, Value::is_array),
        IsPrimitive => is(&args, is_primitive),
        StartsWith | EndsWith | Contains | IndexOf => {
            let (s, p) = (str_arg(&args, 0)?, str_arg(&args, 1)?);
            match f {
                StartsWith => boolean(s.starts_with(p)),
                EndsWith => boolean(s.ends_with(p)),
                Contains => boolean(s.contains(p)),
                _ => {
                    let at = s.find(p).map_or(-1, |byte| s.get(..byte).map_or(0, |pre| pre.chars().count() as i64));
                    Some(Cow::Owned(Value::from(at)))
                }
            }
        }
        Substring => {
            let s = str_arg(&args, 0)?;
            let start = num_arg(&args, 1)?.f64().floor().max(0.0);
            let len = match args.get(2) {
                Some(_) => num_arg(&args, 2)?.f64().floor().max(0.0),
                None => f64::INFINITY,
            };
            // Saturating float→int casts: huge values simply mean "to the end".
            string(s.chars().skip(start as usize).take(len as usize).collect())
        }
        Concat => {
            let mut out = String::new();
            for i in 0..args.len() {
                out.push_str(str_arg(&args, i)?);
            }
            string(out)
        }
        Lower => string(str_arg(&args, 0)?.to_lowercase()),
        Upper => string(str_arg(&args, 0)?.to_uppercase()),
        Length => Some(Cow::Owned(Value::from(str_arg(&args, 0)?.chars().count() as u64))),
        AsNumber => match arg(&args, 0)? {
            Value::Number(_) => number(num_arg(&args, 0)),
            Value::String(s) => {
                let t = s.trim();
                // Rust also parses "inf"/"NaN"; only plain JSON-like numerals count.
                let numeral = t.chars().all(|c| c.is_ascii_digit() || matches!(c, '+' | '-' | '.' | 'e' | 'E'));
                if !numeral {
                    return None;
                }
                match t.parse::<i64>() {
                    Ok(i) => number(Some(Num::I(i))),
                    Err(_) => float(t.parse::<f64>().ok()?),
                }
            }
            _ => None,
        },
        Abs => match num_arg(&args, 0)? {
            Num::I(i) => number(i.checked_abs().map(Num::I).or(Some(Num::F((i as f64).abs())))),
            Num::F(x) => float(x.abs()),
        },
        Ceiling => match num_arg(&args, 0)? {
            n @ Num::I(_) => number(Some(n)),
            Num::F(x) => float(x.ceil()),
        },
        Floor => match num_arg(&args, 0)? {
            n @ Num::I(_) => number(Some(n)),
            Num::F(x) => float(x.floor()),
        },
        Sign => {
            let x = num_arg(&args, 0)?.f64();
            let s = if x > 0.0 {
                1
            } else if x < 0.0 {
                -1
            } else {
                0
            };
            Some(Cow::Owned(Value::from(s)))
        }
        Sqrt => float(num_arg(&args, 0)?.f64().sqrt()),
        Exp => float(num_arg(&args, 0)?.f64().exp()),
        Square => {
            let n = num_arg(&args, 0)?;
            number(num::arith(ArithOp::Mul, n, n))
        }
        Power => float(num_arg(&args, 0)?.f64().powf(num_arg(&args, 1)?.f64())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::eval::{eval, Env};
    use super::super::parser::parse_condition;
    use serde_json::{json, Value};

    fn ev(expr: &str) -> Option<Value> {
        let doc = json!({"s": "Hello wörld", "n": -2.5, "i": 7, "nul": null, "arr": [1], "obj": {}});
        let e = parse_condition(expr).unwrap();
        eval(&e, Env::doc(&doc)).map(|v| v.into_owned())
    }

    #[test]
    fn type_checks() {
        assert_eq!(ev("IS_DEFINED(s)"), Some(json!(true)));
        assert_eq!(ev("is_defined(nope)"), Some(json!(false)));
        assert_eq!(ev("IS_DEFINED(nul)"), Some(json!(true)));
        assert_eq!(ev("IS_NULL(nul)"), Some(json!(true)));
        assert_eq!(ev("IS_NULL(nope)"), Some(json!(false)));
        assert_eq!(ev("IS_STRING(s) AND IS_NUMBER(n) AND IS_ARRAY(arr) AND IS_OBJECT(obj)"), Some(json!(true)));
        assert_eq!(ev("IS_PRIMITIVE(arr) OR IS_BOOL(s)"), Some(json!(false)));
    }

    #[test]
    fn strings() {
        assert_eq!(ev("STARTS_WITH(s, 'Hell')"), Some(json!(true)));
        assert_eq!(ev("ENDS_WITH(s, 'örld')"), Some(json!(true)));
        assert_eq!(ev("CONTAINS(s, 'o w')"), Some(json!(true)));
        assert_eq!(ev("CONTAINS(i, 'o')"), None);
        assert_eq!(ev("INDEX_OF(s, 'rld')"), Some(json!(8)));
        assert_eq!(ev("INDEX_OF(s, 'zzz')"), Some(json!(-1)));
        assert_eq!(ev("SUBSTRING(s, 6, 3)"), Some(json!("wör")));
        assert_eq!(ev("SUBSTRING(s, 100)"), Some(json!("")));
        assert_eq!(ev("SUBSTRING(s, 1e300, 1e300)"), Some(json!("")));
        assert_eq!(ev("CONCAT(s, '!', '?')"), Some(json!("Hello wörld!?")));
        assert_eq!(ev("CONCAT(s, i)"), None);
        assert_eq!(ev("LOWER(s)"), Some(json!("hello wörld")));
        assert_eq!(ev("UPPER(s)"), Some(json!("HELLO WÖRLD")));
        assert_eq!(ev("LENGTH(s)"), Some(json!(11)));
    }

    #[test]
    fn math() {
        assert_eq!(ev("AS_NUMBER('12')"), Some(json!(12)));
        assert_eq!(ev("AS_NUMBER(' 1.5 ')"), Some(json!(1.5)));
        assert_eq!(ev("AS_NUMBER('inf')"), None);
        assert_eq!(ev("AS_NUMBER('x')"), None);
        assert_eq!(ev("ABS(n)"), Some(json!(2.5)));
        assert_eq!(ev("CEILING(n)"), Some(json!(-2)));
        assert_eq!(ev("FLOOR(n)"), Some(json!(-3)));
        assert_eq!(ev("SIGN(n)"), Some(json!(-1)));
        assert_eq!(ev("SQRT(16)"), Some(json!(4)));
        assert_eq!(ev("SQRT(n)"), None);
        assert_eq!(ev("SQUARE(i)"), Some(json!(49)));
        assert_eq!(ev("POWER(2, 10)"), Some(json!(1024)));
        assert_eq!(ev("EXP(0)"), Some(json!(1)));
        assert_eq!(ev("POWER(10, 400)"), None);
    }
}
