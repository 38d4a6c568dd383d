//! Twin values: a JSON object of a chosen size carrying a sequence number and the sender's wall-clock
//! timestamp (µs since the epoch), so a receiver can measure send → receive.

use std::str::FromStr;

use rand::Rng;

/// Value size distribution: a fixed size (`200`) or uniform in a range (`100-4000`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum SizeDist {
    Fixed(usize),
    Uniform(usize, usize),
}

impl SizeDist {
    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        match *self {
            SizeDist::Fixed(n) => n,
            SizeDist::Uniform(lo, hi) => rng.gen_range(lo..=hi),
        }
    }

    pub fn mean(&self) -> usize {
        match *self {
            SizeDist::Fixed(n) => n,
            SizeDist::Uniform(lo, hi) => (lo + hi) / 2,
        }
    }
}

impl std::fmt::Display for SizeDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SizeDist::Fixed(n) => write!(f, "{n}"),
            SizeDist::Uniform(a, b) => write!(f, "{a}-{b}"),
        }
    }
}

impl FromStr for SizeDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| t.trim().parse::<usize>().map_err(|e| format!("bad size {t:?}: {e}"));
        match s.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("empty range {s}"));
                }
                Ok(SizeDist::Uniform(a, b))
            }
            None => Ok(SizeDist::Fixed(num(s)?)),
        }
    }
}

/// `{"seq":N,"ts":T,"pad":"…"}` padded to exactly `bytes` bytes (or the minimum the fields need).
pub fn make(seq: u64, ts_us: u64, bytes: usize) -> String {
    let head = format!("{{\"seq\":{seq},\"ts\":{ts_us},\"pad\":\"");
    let fixed = head.len() + 2;
    let pad = bytes.saturating_sub(fixed);
    let mut s = String::with_capacity(fixed + pad);
    s.push_str(&head);
    // Cheap, deterministic, not all one byte (so nothing compresses it to nothing).
    const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    for i in 0..pad {
        s.push(ALPHA[(i * 7 + seq as usize) % ALPHA.len()] as char);
    }
    s.push_str("\"}");
    s
}

/// The `ts` field of a value made by [`make`] (found anywhere in a JSON document, e.g. a twin push).
pub fn ts_of(doc: &serde_json::Value, path: &[&str]) -> Option<u64> {
    let mut v = doc;
    for p in path {
        v = v.get(*p)?;
    }
    v.get("ts")?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_size_and_valid_json() {
        for n in [0, 10, 50, 200, 4000] {
            let s = make(12, 1_700_000_000_000_000, n);
            let v: serde_json::Value = serde_json::from_str(&s).unwrap();
            assert_eq!(v["seq"], 12);
            if n >= 50 {
                assert_eq!(s.len(), n);
            }
        }
    }

    #[test]
    fn parses_sizes() {
        assert_eq!("200".parse::<SizeDist>().unwrap(), SizeDist::Fixed(200));
        assert_eq!("100-4000".parse::<SizeDist>().unwrap(), SizeDist::Uniform(100, 4000));
        assert!("5-1".parse::<SizeDist>().is_err());
    }
}
