//! Timestamps: microseconds since the Unix epoch, UTC (Spark's precision).

use chrono::{DateTime, SecondsFormat, Utc};

/// Microseconds since 1970-01-01T00:00:00Z.
pub type TimestampMicros = i64;

/// Parses an RFC 3339 timestamp (`2026-01-01T10:00:00Z`) into microseconds.
///
/// ```
/// let t = tidemark::time::parse_rfc3339("1970-01-01T00:00:01Z").unwrap();
/// assert_eq!(t, 1_000_000);
/// ```
pub fn parse_rfc3339(text: &str) -> Option<TimestampMicros> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc).timestamp_micros())
}

/// Formats microseconds as RFC 3339 UTC, with fractional seconds only when
/// they are not zero (`2026-01-01T10:50:00Z`).
pub fn format_rfc3339(micros: TimestampMicros) -> String {
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
}
