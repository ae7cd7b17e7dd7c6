//! Spark-style duration strings: `"10 minutes"`, `"5 seconds"`, `"1 hour"`.

use crate::error::{Error, Result};
use std::time::Duration;

/// Parses a Spark interval string into a [`Duration`].
///
/// Accepts one or more `<number> <unit>` pairs (`"1 hour 30 minutes"`), units
/// from microseconds to weeks, singular or plural, with the abbreviations
/// `us`, `ms`, `s`/`sec`, `min`, `h`. Months and years are refused, as Spark
/// refuses them for windows and watermarks: their length is not fixed.
///
/// ```
/// use std::time::Duration;
/// let d = tidemark_types::duration::parse_duration("10 minutes").unwrap();
/// assert_eq!(d, Duration::from_secs(600));
/// assert!(tidemark_types::duration::parse_duration("1 month").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration> {
    let invalid = |reason: String| Error::config("duration", format!("`{text}`: {reason}"));
    let tokens: Vec<&str> = text.split_whitespace().collect();
    if tokens.is_empty() {
        return Err(invalid(
            "empty; write e.g. \"10 minutes\" or \"250 milliseconds\"".into(),
        ));
    }
    let mut total_micros: u128 = 0;
    let mut i = 0;
    while i < tokens.len() {
        // Accept both "10 minutes" and "10minutes".
        let (number, unit) = match tokens[i].find(|c: char| c.is_ascii_alphabetic()) {
            Some(pos) if pos > 0 => (&tokens[i][..pos], &tokens[i][pos..]),
            _ => {
                let unit = tokens.get(i + 1).copied().ok_or_else(|| {
                    invalid(format!(
                        "`{}` has no unit; units: microseconds, milliseconds, seconds, minutes, hours, days, weeks",
                        tokens[i]
                    ))
                })?;
                i += 1;
                (tokens[i - 1], unit)
            }
        };
        i += 1;
        let amount: u128 = number
            .parse()
            .map_err(|_| invalid(format!("`{number}` is not a non-negative whole number")))?;
        let unit_micros = unit_in_micros(&unit.to_ascii_lowercase()).map_err(invalid)?;
        total_micros = amount
            .checked_mul(unit_micros)
            .and_then(|m| total_micros.checked_add(m))
            .ok_or_else(|| invalid("too large".into()))?;
    }
    // Durations become signed microseconds next to timestamps: refuse what
    // would not fit rather than wrap to a negative delay or size.
    let micros = i64::try_from(total_micros).map_err(|_| invalid("too large".into()))?;
    Ok(Duration::from_micros(micros.unsigned_abs()))
}

/// A duration in signed microseconds, the unit of event time: a duration
/// too long for an `i64` (about 292,000 years, reachable only through
/// `Duration::MAX`-like values from Rust) saturates at `i64::MAX` instead of
/// wrapping to a negative delay.
///
/// ```
/// use std::time::Duration;
/// use tidemark_types::duration::micros;
/// assert_eq!(micros(Duration::from_millis(1500)), 1_500_000);
/// assert_eq!(micros(Duration::MAX), i64::MAX);
/// ```
pub fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn unit_in_micros(unit: &str) -> std::result::Result<u128, String> {
    Ok(match unit {
        "microsecond" | "microseconds" | "us" => 1,
        "millisecond" | "milliseconds" | "ms" => 1_000,
        "second" | "seconds" | "s" | "sec" | "secs" => 1_000_000,
        "minute" | "minutes" | "min" | "mins" => 60_000_000,
        "hour" | "hours" | "h" => 3_600_000_000,
        "day" | "days" | "d" => 86_400_000_000,
        "week" | "weeks" => 7 * 86_400_000_000,
        "month" | "months" | "year" | "years" => {
            return Err(format!(
                "`{unit}` is not supported: months and years have no fixed length (as in Spark); use days or weeks"
            ))
        }
        other => {
            return Err(format!(
                "unknown unit `{other}`; units: microseconds, milliseconds, seconds, minutes, hours, days, weeks"
            ))
        }
    })
}

/// Formats a duration the way it would be written in a pipeline file.
pub fn format_duration(d: Duration) -> String {
    let micros = d.as_micros();
    for (size, unit) in [
        (86_400_000_000u128, "days"),
        (3_600_000_000, "hours"),
        (60_000_000, "minutes"),
        (1_000_000, "seconds"),
        (1_000, "milliseconds"),
    ] {
        if micros >= size && micros.is_multiple_of(size) {
            return format!("{} {unit}", micros / size);
        }
    }
    format!("{micros} microseconds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_spark_units() {
        assert_eq!(
            parse_duration("10 minutes").unwrap(),
            Duration::from_secs(600)
        );
        assert_eq!(parse_duration("5 seconds").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1 hour").unwrap(), Duration::from_secs(3600));
        assert_eq!(
            parse_duration("250 milliseconds").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_duration("7 microseconds").unwrap(),
            Duration::from_micros(7)
        );
        assert_eq!(
            parse_duration("2 days").unwrap(),
            Duration::from_secs(172_800)
        );
        assert_eq!(
            parse_duration("1 hour 30 minutes").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
    }

    #[test]
    fn refuses_months_years_and_garbage() {
        let err = parse_duration("1 month").unwrap_err().to_string();
        assert!(err.contains("months and years"), "{err}");
        assert!(parse_duration("2 years").is_err());
        assert!(parse_duration("ten minutes").is_err());
        assert!(parse_duration("10 fortnights").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-5 seconds").is_err());
        // Fits a u64 of microseconds but not the signed microseconds event
        // time is counted in: refused, not wrapped to a negative duration.
        let err = parse_duration("16000000 weeks").unwrap_err().to_string();
        assert!(err.contains("too large"), "{err}");
        assert!(parse_duration("15000000 weeks").is_ok());
    }

    #[test]
    fn formats_back() {
        assert_eq!(format_duration(Duration::from_secs(600)), "10 minutes");
        assert_eq!(
            format_duration(Duration::from_millis(250)),
            "250 milliseconds"
        );
    }
}
