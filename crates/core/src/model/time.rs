//! ISO-8601 rendering of the unix-millisecond timestamps that commands carry. No clock here: apply must
//! be deterministic, so every time it writes comes from the command.

/// Marks a time that was never set; renders as IoT Hub's `0001-01-01T00:00:00Z`.
pub const NEVER: i64 = i64::MIN;

const NEVER_TEXT: &str = "0001-01-01T00:00:00Z";

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, milliseconds), as IoT Hub's `$lastUpdated`. Times before the unix
/// epoch cannot come from a proposer's clock, so they render as "never set" rather than as odd dates.
pub fn format_ms(ms: i64) -> String {
    Timestamp(ms).to_string()
}

/// [`format_ms`] as a `Display`: a renderer writes it into its output without a `String` of its own
/// (every twin it renders has a `$lastUpdated` per member).
#[derive(Clone, Copy, Debug)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The 24 bytes of `YYYY-MM-DDTHH:MM:SS.mmmZ`, written without a formatter (a twin's reply has a
    /// `$lastUpdated` per member, and `write!` with padded integers was most of its rendering);
    /// `None` for a time that is never set or past year 9999, which do not have that shape.
    fn digits(self) -> Option<[u8; 24]> {
        let ms = self.0;
        if ms < 0 {
            return None;
        }
        let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
        if y > 9999 {
            return None;
        }
        let in_day = ms.rem_euclid(86_400_000);
        let mut out = *b"0000-00-00T00:00:00.000Z";
        let mut put = |at: usize, width: usize, mut n: i64| {
            for i in (at..at + width).rev() {
                out[i] = b'0' + (n % 10) as u8;
                n /= 10;
            }
        };
        put(0, 4, y);
        put(5, 2, i64::from(m));
        put(8, 2, i64::from(d));
        put(11, 2, in_day / 3_600_000);
        put(14, 2, (in_day / 60_000) % 60);
        put(17, 2, (in_day / 1000) % 60);
        put(20, 3, in_day % 1000);
        Some(out)
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0;
        if ms < 0 {
            return f.write_str(NEVER_TEXT);
        }
        if let Some(text) = self.digits().as_ref().and_then(|d| std::str::from_utf8(d).ok()) {
            return f.write_str(text);
        }
        let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
        let in_day = ms.rem_euclid(86_400_000);
        let (h, min, s, milli) = (in_day / 3_600_000, (in_day / 60_000) % 60, (in_day / 1000) % 60, in_day % 1000);
        write!(f, "{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
    }
}

impl Timestamp {
    /// The JSON string serde writes for it (quotes included, nothing to escape), appended to `out`.
    pub(crate) fn write_json(self, out: &mut Vec<u8>) {
        out.push(b'"');
        match self.digits() {
            Some(digits) => out.extend_from_slice(&digits),
            // A time never set is the common case of the rest (a device's status and activity times).
            None if self.0 < 0 => out.extend_from_slice(NEVER_TEXT.as_bytes()),
            None => out.extend_from_slice(self.to_string().as_bytes()),
        }
        out.push(b'"');
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.digits().as_ref().and_then(|d| std::str::from_utf8(d).ok()) {
            Some(text) => s.serialize_str(text),
            None => s.collect_str(self),
        }
    }
}

/// Howard Hinnant's `civil_from_days`: proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_epoch_and_known_instants() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        // 2016-03-30T16:24:48.789Z, the docs' example.
        assert_eq!(format_ms(1_459_355_088_789), "2016-03-30T16:24:48.789Z");
        // A leap day.
        assert_eq!(format_ms(951_782_400_001), "2000-02-29T00:00:00.001Z");
        assert_eq!(format_ms(1_700_000_000_000), "2023-11-14T22:13:20.000Z");
    }

    #[test]
    fn the_fast_digits_match_the_formatter_everywhere() {
        let slow = |ms: i64| {
            let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
            let t = ms.rem_euclid(86_400_000);
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
                t / 3_600_000,
                (t / 60_000) % 60,
                (t / 1000) % 60,
                t % 1000
            )
        };
        let mut ms = 0i64;
        while ms < 253_402_300_800_000 {
            // up to 9999-12-31; a step that visits every field's carries
            assert_eq!(format_ms(ms), slow(ms), "{ms}");
            assert_eq!(serde_json::to_string(&Timestamp(ms)).ok(), Some(format!("\"{}\"", slow(ms))));
            let mut written = Vec::new();
            Timestamp(ms).write_json(&mut written);
            assert_eq!(written, format!("\"{}\"", slow(ms)).into_bytes());
            ms += 999_999_937;
        }
        // Past year 9999 the year takes more digits, as before.
        assert_eq!(format_ms(253_402_300_800_000), "10000-01-01T00:00:00.000Z");
        assert_eq!(serde_json::to_string(&Timestamp(NEVER)).ok(), Some("\"0001-01-01T00:00:00Z\"".into()));
        for ms in [NEVER, -1, 253_402_300_800_000] {
            let mut written = Vec::new();
            Timestamp(ms).write_json(&mut written);
            assert_eq!(Some(written), serde_json::to_vec(&Timestamp(ms)).ok(), "{ms}");
        }
    }

    #[test]
    fn never_set_renders_as_year_one() {
        assert_eq!(format_ms(NEVER), "0001-01-01T00:00:00Z");
        assert_eq!(format_ms(-1), "0001-01-01T00:00:00Z");
    }
}
