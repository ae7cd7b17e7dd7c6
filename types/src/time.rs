//! Timestamps: microseconds since the Unix epoch, UTC (Spark's precision).

use chrono::{DateTime, SecondsFormat, Utc};

/// Microseconds since 1970-01-01T00:00:00Z.
pub type TimestampMicros = i64;

/// The earliest timestamp Spark supports, `0001-01-01T00:00:00Z`.
pub const MIN_TIMESTAMP_MICROS: TimestampMicros = -62_135_596_800_000_000;

/// The latest timestamp Spark supports, `9999-12-31T23:59:59.999999Z`.
/// Event times are held within these bounds, so that window and watermark
/// arithmetic on them (sizes and delays of up to thousands of years) never
/// overflows.
pub const MAX_TIMESTAMP_MICROS: TimestampMicros = 253_402_300_799_999_999;

/// Parses an RFC 3339 timestamp (`2026-01-01T10:00:00Z`) into microseconds.
///
/// ```
/// let t = tidemark_types::time::parse_rfc3339("1970-01-01T00:00:01Z").unwrap();
/// assert_eq!(t, 1_000_000);
/// ```
pub fn parse_rfc3339(text: &str) -> Option<TimestampMicros> {
    parse_utc_fast(text.as_bytes()).or_else(|| {
        DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|t| t.with_timezone(&Utc).timestamp_micros())
    })
}

/// The form nearly every record carries, `YYYY-MM-DDTHH:MM:SS[.f…]Z`, read
/// without chrono's general parser (a quarter of a decode's time before);
/// anything else (offsets, leap seconds, other separators) is left to
/// chrono, which gives the same answer for this form too.
fn parse_utc_fast(b: &[u8]) -> Option<TimestampMicros> {
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    if b[13] != b':' || b[16] != b':' || *b.last()? != b'Z' {
        return None;
    }
    let days = days_of_date(b)?;
    let (hour, minute, second) = (two_digits(b, 11)?, two_digits(b, 14)?, two_digits(b, 17)?);
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let fraction = &b[19..b.len() - 1];
    let micros = match fraction {
        [] => 0,
        [b'.', rest @ ..] if (1..=9).contains(&rest.len()) => {
            let mut micros = 0;
            for (i, &c) in rest.iter().enumerate() {
                let digit = c.wrapping_sub(b'0');
                if digit > 9 {
                    return None;
                }
                if i < 6 {
                    micros = micros * 10 + i64::from(digit);
                }
            }
            micros * 10i64.pow(6 - rest.len().min(6) as u32)
        }
        _ => return None,
    };
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    Some(seconds * 1_000_000 + micros)
}

/// Days since 1970-01-01 of the valid date `YYYY-MM-DD` that `b` starts
/// with. The last date read is kept per thread: a stream's timestamps
/// mostly share their day, and this is a good part of a JSON decode.
fn days_of_date(b: &[u8]) -> Option<i64> {
    thread_local! {
        static LAST: std::cell::Cell<Option<([u8; 10], i64)>> = const { std::cell::Cell::new(None) };
    }
    let date: [u8; 10] = b.get(..10)?.try_into().ok()?;
    if let Some((last, days)) = LAST.get() {
        if last == date {
            return Some(days);
        }
    }
    let (year, month, day) = (
        two_digits(b, 0)? * 100 + two_digits(b, 2)?,
        two_digits(b, 5)?,
        two_digits(b, 8)?,
    );
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    LAST.set(Some((date, days)));
    Some(days)
}

/// The number the two ASCII digits at `at` write, if both are digits (the
/// caller has checked the length).
fn two_digits(b: &[u8], at: usize) -> Option<i64> {
    let (tens, ones) = (b[at].wrapping_sub(b'0'), b[at + 1].wrapping_sub(b'0'));
    (tens < 10 && ones < 10).then(|| i64::from(tens * 10 + ones))
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// An RFC 3339 UTC text built on the stack (years 0 to 9999), so that
/// writing a timestamp to JSON allocates nothing.
pub struct Rfc3339 {
    bytes: [u8; 27],
    len: usize,
}

impl Rfc3339 {
    /// `micros` as [`format_rfc3339`] writes it, if its year has four
    /// digits.
    pub fn of(micros: TimestampMicros) -> Option<Self> {
        let (seconds, sub) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
        let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        if !(0..=9999).contains(&year) {
            return None;
        }
        let mut bytes = *b"0000-00-00T00:00:00.000000Z";
        let mut put = |at: usize, width: usize, mut n: i64| {
            for i in (at..at + width).rev() {
                bytes[i] = b'0' + (n % 10) as u8;
                n /= 10;
            }
        };
        put(0, 4, year);
        put(5, 2, month);
        put(8, 2, day);
        put(11, 2, of_day / 3_600);
        put(14, 2, of_day / 60 % 60);
        put(17, 2, of_day % 60);
        let len = if sub == 0 {
            19
        } else if sub % 1_000 == 0 {
            put(20, 3, sub / 1_000);
            23
        } else {
            put(20, 6, sub);
            26
        };
        bytes[len] = b'Z';
        Some(Rfc3339 {
            bytes,
            len: len + 1,
        })
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and separators were written.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

/// Formats microseconds as RFC 3339 UTC, with fractional seconds only when
/// they are not zero (`2026-01-01T10:50:00Z`).
pub fn format_rfc3339(micros: TimestampMicros) -> String {
    if let Some(text) = Rfc3339::of(micros) {
        return text.as_str().to_string();
    }
    format_rfc3339_chrono(micros)
}

fn format_rfc3339_chrono(micros: TimestampMicros) -> String {
    match DateTime::<Utc>::from_timestamp_micros(micros) {
        Some(t) if micros % 1_000_000 == 0 => t.to_rfc3339_opts(SecondsFormat::Secs, true),
        Some(t) if micros % 1_000 == 0 => t.to_rfc3339_opts(SecondsFormat::Millis, true),
        Some(t) => t.to_rfc3339_opts(SecondsFormat::Micros, true),
        None => format!("{micros}us"),
    }
}

/// The current wall-clock time in microseconds.
pub fn now_micros() -> TimestampMicros {
    Utc::now().timestamp_micros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let t = parse_rfc3339("2026-01-01T10:50:00Z").unwrap();
        assert_eq!(format_rfc3339(t), "2026-01-01T10:50:00Z");
        let t = parse_rfc3339("2026-01-01T10:50:00.250+01:00").unwrap();
        assert_eq!(format_rfc3339(t), "2026-01-01T09:50:00.250Z");
        assert!(parse_rfc3339("yesterday").is_none());
    }

    fn parse_chrono(text: &str) -> Option<TimestampMicros> {
        DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|t| t.with_timezone(&Utc).timestamp_micros())
    }

    #[test]
    fn the_fast_path_agrees_with_chrono_at_the_edges() {
        for text in [
            "1970-01-01T00:00:00Z",
            "1969-12-31T23:59:59.999999Z",
            "2024-02-29T12:00:00.5Z",
            "2023-02-29T12:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T23:59:60Z",
            "2026-01-01T10:00:00.123456789Z",
            "2026-01-01T10:00:00.1234567891Z",
            "2026-01-01T10:00:00.Z",
            "2026-01-01t10:00:00z",
            "2026-01-01 10:00:00Z",
            "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999Z",
            "2026-01-01T10:00:00+00:00",
            "+2026-01-01T10:00:00Z",
            "2026-1-01T10:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(text), parse_chrono(text), "{text}");
        }
        for micros in [
            0,
            -1,
            1_000,
            -1_000_000,
            253_402_300_799_999_999,
            -62_167_219_200_000_000,
        ] {
            assert_eq!(
                format_rfc3339(micros),
                format_rfc3339_chrono(micros),
                "{micros}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn formats_and_parses_as_chrono(micros in -62_167_219_200_000_000i64..253_402_300_800_000_000) {
            let text = format_rfc3339(micros);
            proptest::prop_assert_eq!(&text, &format_rfc3339_chrono(micros));
            proptest::prop_assert_eq!(parse_rfc3339(&text), Some(micros));
            proptest::prop_assert_eq!(parse_utc_fast(text.as_bytes()), parse_chrono(&text));
        }

        #[test]
        fn any_near_timestamp_text_parses_as_chrono(text in "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,10})?Z?") {
            proptest::prop_assert_eq!(parse_rfc3339(&text), parse_chrono(&text));
        }
    }
}
