//! Randomized robustness: token soups, random bytes and mutated corpus queries must never panic,
//! whether they parse or not; whatever parses is also evaluated, paged and aggregated. Runs on
//! small-stack threads so a recursion regression shows up here rather than in production.

use serde_json::Value;
use twinhub::query::{parse, parse_condition, Cursor, Query};

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const VOCAB: &[&str] = &[
    "SELECT",
    "select",
    "TOP",
    "*",
    "FROM",
    "devices",
    "devices.modules",
    "devices.jobs",
    "modules",
    "jobs",
    "WHERE",
    "GROUP",
    "BY",
    "AS",
    "AND",
    "OR",
    "NOT",
    "IN",
    "NIN",
    "true",
    "false",
    "null",
    "undefined",
    "=",
    "!=",
    "<>",
    "<",
    ">",
    "<=",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    ":",
    "[[",
    "]]",
    "[[group]]",
    "tags",
    "properties",
    "reported",
    "desired",
    "deviceId",
    "moduleId",
    "jobId",
    "status",
    "tags.floor",
    "properties.reported.batteryLevel",
    "properties.reported.temp",
    "tags.location.region",
    "$version",
    "x",
    "d",
    "COUNT()",
    "COUNT",
    "SUM",
    "AVG",
    "MIN",
    "MAX",
    "IS_DEFINED",
    "STARTS_WITH",
    "SUBSTRING",
    "AS_NUMBER",
    "CONCAT",
    "POWER",
    "LOWER",
    "'US'",
    "'dev-01'",
    "\"x\"",
    "'",
    "\"",
    "'\\u",
    "'\\uD800'",
    "\\",
    "0",
    "1",
    "-1",
    "2.5",
    "1e308",
    "1e999",
    "0x",
    "0xFF",
    "9223372036854775808",
    "18446744073709551616",
    "é",
    "😀",
    "\u{0}",
    "\t",
    "!",
    "#",
    "@",
    "$",
    "`",
    ";",
];

fn token_soup(rng: &mut Rng) -> String {
    let n = 1 + rng.below(40);
    let mut s = String::new();
    if rng.below(3) > 0 {
        s.push_str("SELECT ");
    }
    for _ in 0..n {
        s.push_str(rng.pick(VOCAB));
        if rng.below(4) > 0 {
            s.push(' ');
        }
    }
    s
}

fn random_bytes(rng: &mut Rng) -> String {
    let n = rng.below(120);
    let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn mutate(rng: &mut Rng, base: &str) -> String {
    let mut chars: Vec<char> = base.chars().collect();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(chars.len() + 1);
        match rng.below(3) {
            0 if at < chars.len() => {
                chars.remove(at);
            }
            1 => {
                let piece: Vec<char> = rng.pick(VOCAB).chars().collect();
                for (i, c) in piece.into_iter().enumerate() {
                    chars.insert((at + i).min(chars.len()), c);
                }
            }
            _ if chars.len() > 1 => {
                let other = rng.below(chars.len());
                let at = at.min(chars.len() - 1);
                chars.swap(at, other);
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

fn fixtures() -> Vec<Value> {
    let f: Value = serde_json::from_str(include_str!("fixtures/query/twins.json")).unwrap();
    ["devices", "modules", "jobs"]
        .iter()
        .flat_map(|k| f.get(*k).and_then(Value::as_array).cloned().unwrap_or_default())
        .collect()
}

fn corpus_queries() -> Vec<String> {
    let c: Vec<Value> = serde_json::from_str(include_str!("fixtures/query/corpus.json")).unwrap();
    c.iter()
        .filter_map(|e| e.get("query").or_else(|| e.get("condition")).and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// Everything a parsed query can be asked to do.
fn exercise(q: &Query, docs: &[Value]) {
    let _ = q.item_type();
    let _ = q.run(docs);
    for d in docs {
        if q.matches(d) {
            let _ = q.project(d);
        }
    }
    if let Some(mut p) = q.partial() {
        let mut other = q.partial().unwrap();
        for (i, d) in docs.iter().enumerate() {
            if i % 2 == 0 {
                p.add(d);
            } else {
                other.add(d);
            }
        }
        p.merge_state(other.state()).unwrap();
        let _ = p.finish();
    } else {
        let rows = q.shard_rows(docs, None, 2);
        let page = q.page(vec![rows], None, 2);
        if let Some(c) = page.next {
            let c = q.cursor(&c.encode()).unwrap();
            let rows = q.shard_rows(docs, Some(&c), 2);
            let _ = q.page(vec![rows], Some(&c), 2);
        }
    }
}

fn check(text: &str, docs: &[Value]) {
    if let Ok(q) = parse(text) {
        exercise(&q, docs);
    }
    if let Ok(c) = parse_condition(text) {
        for d in docs {
            let _ = c.matches(d);
        }
    }
    if let Err(e) = parse(text) {
        // Positions point into the text (or just past its end).
        assert!(e.position >= 1 && e.position <= text.chars().count() + 1, "{text:?}: {e}");
    }
    let _ = Cursor::decode(text);
}

/// 2 MiB: a quarter of a node's worker stack (8 MiB, see `cli::serve`). Maximal nesting of the
/// costliest shape (every precedence level of binary operators and a call at each of 62 levels) needs
/// between 640 KiB and 2 MiB unoptimized, far less optimized; this leaves room for the caller yet
/// catches recursion regressions.
fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new().stack_size(2048 * 1024).spawn(f).unwrap().join().unwrap();
}

#[test]
fn random_inputs_never_panic() {
    on_small_stack(|| {
        let docs = fixtures();
        let corpus = corpus_queries();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut parsed = 0usize;
        for i in 0..30_000 {
            let text = match i % 3 {
                0 => token_soup(&mut rng),
                1 => random_bytes(&mut rng),
                _ => {
                    let base = corpus[rng.below(corpus.len())].clone();
                    mutate(&mut rng, &base)
                }
            };
            if parse(&text).is_ok() {
                parsed += 1;
            }
            check(&text, &docs);
        }
        // The generator must actually reach the evaluator, not only the error paths.
        assert!(parsed > 500, "only {parsed} random queries parsed");
    });
}

#[test]
fn maximal_nesting_evaluates_on_a_small_stack() {
    on_small_stack(|| {
        let docs = fixtures();
        let nest =
            |open: &str, inner: &str, close: &str, n: usize| format!("{}{inner}{}", open.repeat(n), close.repeat(n));
        let exprs = [
            nest("(", "tags.floor + 1 = 2 OR NOT deviceId IN [1, -2, tags.floor]", ")", 60),
            nest("ABS(", "tags.floor", ")", 62) + " = 1",
            nest("NOT ", "true", "", 62),
            nest("- ", "tags.floor", "", 62) + " = 1",
            nest("[", "tags.floor", "]", 62) + " = 1",
            nest("{a: ", "tags.floor", "}", 62) + " = 1",
            nest("CONCAT(", "deviceId", ", 'x')", 62) + " = 'a'",
            // The deepest frames a level can cost: every precedence level of binary operators, then
            // a call, at each of the 62 levels.
            nest("tags.a OR tags.b AND tags.c = tags.d + tags.e * ABS(", "tags.floor", ")", 62) + " = 1",
        ];
        for e in exprs {
            check(&format!("SELECT * FROM devices WHERE {e}"), &docs);
            check(&format!("SELECT {e} AS v FROM devices"), &docs);
            check(&format!("SELECT COUNT() AS n, SUM({e}) AS s FROM devices GROUP BY {e}"), &docs);
            assert!(parse(&format!("SELECT * FROM devices WHERE {e}")).is_ok(), "{e}");
        }
    });
}
