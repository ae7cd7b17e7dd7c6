//! Window assignment: tumbling, sliding and session windows (Spark's rules).

use crate::duration::parse_duration;
use crate::error::{Error, Result};
use crate::time::TimestampMicros;

/// A half-open event-time interval `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeWindow {
    /// Inclusive start, microseconds.
    pub start: TimestampMicros,
    /// Exclusive end, microseconds.
    pub end: TimestampMicros,
}

/// How rows are assigned to windows.
#[derive(Debug, Clone, PartialEq)]
pub enum WindowSpec {
    /// Fixed-size, non-overlapping windows aligned to the epoch plus `offset`.
    Tumbling {
        /// Window length.
        size: i64,
        /// Spark's `startTime`: shifts the alignment.
        offset: i64,
    },
    /// Fixed-size windows starting every `slide`; a row falls in
    /// `ceil(size / slide)` windows.
    Sliding {
        /// Window length.
        size: i64,
        /// Distance between window starts (≤ size).
        slide: i64,
        /// Spark's `startTime`: shifts the alignment.
        offset: i64,
    },
    /// Gap-based windows: a session grows while rows arrive within `gap` of
    /// each other.
    Session {
        /// Inactivity gap, microseconds.
        gap: i64,
    },
    /// Session windows whose gap each row gives (Spark's dynamic gap): an
    /// expression yielding a duration string (`"5 minutes"`) or
    /// milliseconds. A row whose gap is null, unreadable or not positive
    /// opens no session, as Spark drops it.
    DynamicSession {
        /// The gap expression.
        gap: crate::expr::Expr,
    },
}

fn micros(text: &str, key: &str) -> Result<i64> {
    let d = parse_duration(text).map_err(|e| Error::config(key, e.to_string()))?;
    i64::try_from(d.as_micros()).map_err(|_| Error::config(key, "duration too large"))
}

impl WindowSpec {
    /// Tumbling windows of `size` (a Spark duration string).
    ///
    /// ```
    /// use tidemark_types::window::WindowSpec;
    /// let w = WindowSpec::tumbling("5 minutes").unwrap();
    /// let windows = w.assign(7 * 60_000_000);
    /// assert_eq!(windows[0].start, 5 * 60_000_000);
    /// assert_eq!(windows[0].end, 10 * 60_000_000);
    /// ```
    pub fn tumbling(size: &str) -> Result<Self> {
        let size = micros(size, "window.tumbling")?;
        if size <= 0 {
            return Err(Error::config(
                "window.tumbling",
                "the window size must be positive",
            ));
        }
        Ok(WindowSpec::Tumbling { size, offset: 0 })
    }

    /// Sliding windows of `size` every `slide`; `slide` must not exceed `size`.
    pub fn sliding(size: &str, slide: &str) -> Result<Self> {
        let size = micros(size, "window.sliding")?;
        let slide = micros(slide, "window.slide")?;
        if size <= 0 || slide <= 0 {
            return Err(Error::config(
                "window.sliding",
                "the window size and slide must be positive",
            ));
        }
        if slide > size {
            return Err(Error::config(
                "window.slide",
                format!(
                    "the slide ({}) must be less than or equal to the window size ({}), as in Spark",
                    crate::duration::format_duration(std::time::Duration::from_micros(slide as u64)),
                    crate::duration::format_duration(std::time::Duration::from_micros(size as u64)),
                ),
            ));
        }
        Ok(WindowSpec::Sliding {
            size,
            slide,
            offset: 0,
        })
    }

    /// Session windows closed after `gap` of inactivity.
    pub fn session(gap: &str) -> Result<Self> {
        let gap = micros(gap, "window.session")?;
        if gap <= 0 {
            return Err(Error::config("window.session", "the gap must be positive"));
        }
        Ok(WindowSpec::Session { gap })
    }

    /// Session windows with a per-row gap from `expression` (a column name
    /// or any expression giving a duration string or milliseconds).
    pub fn dynamic_session(expression: &str) -> Result<Self> {
        Ok(WindowSpec::DynamicSession {
            gap: crate::expr::Expr::parse(expression)?,
        })
    }

    /// Shifts the alignment of tumbling/sliding windows (Spark's `startTime`).
    pub fn with_offset(mut self, start_offset: &str) -> Result<Self> {
        let value = micros(start_offset, "window.start_offset")?;
        match &mut self {
            WindowSpec::Tumbling { size, offset }
            | WindowSpec::Sliding {
                slide: size,
                offset,
                ..
            } => {
                if value >= *size {
                    return Err(Error::config(
                        "window.start_offset",
                        "the start offset must be less than the slide (or the size for tumbling windows)",
                    ));
                }
                *offset = value;
            }
            WindowSpec::Session { .. } | WindowSpec::DynamicSession { .. } => {
                return Err(Error::config(
                    "window.start_offset",
                    "session windows have no start offset",
                ))
            }
        }
        Ok(self)
    }

    /// The windows that contain `t`, earliest start first. For sessions this
    /// is the row's own proto-session `[t, t + gap)`.
    pub fn assign(&self, t: TimestampMicros) -> Vec<TimeWindow> {
        let mut out = Vec::new();
        self.assign_into(t, None, &mut out);
        out
    }

    /// The windows of `t` (and, for a dynamic session gap, of `row`)
    /// appended to `out`, earliest start first: the allocation-free form
    /// operators use per row.
    pub fn assign_into(
        &self,
        t: TimestampMicros,
        row: Option<&crate::row::Row>,
        out: &mut Vec<TimeWindow>,
    ) {
        match self {
            // Saturating: event times are checked to Spark's range before
            // they get here, but a time column read otherwise must not
            // panic or wrap.
            WindowSpec::Tumbling { size, offset } => {
                let start = t.saturating_sub(t.saturating_sub(*offset).rem_euclid(*size));
                out.push(TimeWindow {
                    start,
                    end: start.saturating_add(*size),
                });
            }
            WindowSpec::Sliding {
                size,
                slide,
                offset,
            } => {
                let first = out.len();
                let mut start = t.saturating_sub(t.saturating_sub(*offset).rem_euclid(*slide));
                while start.saturating_add(*size) > t {
                    out.push(TimeWindow {
                        start,
                        end: start.saturating_add(*size),
                    });
                    let next = start.saturating_sub(*slide);
                    if next == start {
                        break;
                    }
                    start = next;
                }
                out[first..].reverse();
            }
            WindowSpec::Session { gap } => out.push(TimeWindow {
                start: t,
                end: t.saturating_add(*gap),
            }),
            WindowSpec::DynamicSession { gap } => {
                let Some(row) = row else { return };
                let micros = match gap.eval(row) {
                    crate::row::Value::Str(s) => parse_duration(&s)
                        .ok()
                        .and_then(|d| i64::try_from(d.as_micros()).ok()),
                    crate::row::Value::Long(ms) => ms.checked_mul(1000),
                    _ => None,
                };
                if let Some(g) = micros.filter(|g| *g > 0) {
                    out.push(TimeWindow {
                        start: t,
                        end: t.saturating_add(g),
                    });
                }
            }
        }
    }

    /// The windows of a row at time `t`: [`WindowSpec::assign`], with the
    /// dynamic session gap read from the row.
    pub fn assign_row(&self, t: TimestampMicros, row: &crate::row::Row) -> Vec<TimeWindow> {
        let mut out = Vec::new();
        self.assign_into(t, Some(row), &mut out);
        out
    }

    /// Whether this is a session window.
    pub fn is_session(&self) -> bool {
        matches!(
            self,
            WindowSpec::Session { .. } | WindowSpec::DynamicSession { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H: i64 = 3_600_000_000;

    #[test]
    fn sliding_matches_the_seed_example() {
        // 6-hour windows every hour: an order at 05:30 is in windows
        // starting 00:00 .. 05:00.
        let w = WindowSpec::sliding("6 hours", "1 hour").unwrap();
        let windows = w.assign(5 * H + H / 2);
        assert_eq!(windows.len(), 6);
        assert_eq!(
            windows[0],
            TimeWindow {
                start: 0,
                end: 6 * H
            }
        );
        assert_eq!(
            windows[5],
            TimeWindow {
                start: 5 * H,
                end: 11 * H
            }
        );
    }

    #[test]
    fn slide_larger_than_size_is_refused() {
        let err = WindowSpec::sliding("1 hour", "2 hours")
            .unwrap_err()
            .to_string();
        assert!(err.contains("window.slide"), "{err}");
    }

    #[test]
    fn dynamic_gap_comes_from_the_row() {
        let w = WindowSpec::dynamic_session("gap").unwrap();
        let row =
            |gap: crate::row::Value| -> crate::row::Row { [("gap", gap)].into_iter().collect() };
        assert_eq!(
            w.assign_row(0, &row("10 minutes".into())),
            vec![TimeWindow {
                start: 0,
                end: H / 6
            }]
        );
        assert_eq!(
            w.assign_row(0, &row(crate::row::Value::Long(1000))),
            vec![TimeWindow {
                start: 0,
                end: 1_000_000
            }]
        );
        assert!(w.assign_row(0, &row(crate::row::Value::Long(0))).is_empty());
        assert!(w.assign_row(0, &row(crate::row::Value::Null)).is_empty());
    }

    #[test]
    fn offset_shifts_alignment() {
        let w = WindowSpec::tumbling("1 hour")
            .unwrap()
            .with_offset("15 minutes")
            .unwrap();
        assert_eq!(
            w.assign(H)[0],
            TimeWindow {
                start: H / 4,
                end: H + H / 4
            }
        );
    }

    proptest! {
        #[test]
        fn sliding_windows_are_exactly_those_containing_t(
            t in -10_000_000_000i64..10_000_000_000,
            slide in 1i64..1_000_000,
            factor in 1i64..8,
            extra in 0i64..1_000_000,
        ) {
            let size = slide * factor + extra % slide;
            let spec = WindowSpec::Sliding { size, slide, offset: 0 };
            let windows = spec.assign(t);
            // Brute force: every start aligned to `slide` within (t - size, t].
            let mut expected = Vec::new();
            let mut start = (t - size - slide).div_euclid(slide) * slide;
            while start <= t {
                if start.rem_euclid(slide) == 0 && start <= t && t < start + size {
                    expected.push(TimeWindow { start, end: start + size });
                }
                start += slide;
            }
            prop_assert_eq!(windows, expected);
        }

        /// Any time, however extreme, gets windows without a panic (the
        /// dev profile checks overflow) or a wrapped window.
        #[test]
        fn no_time_panics_or_wraps(t in any::<i64>(), size in 1i64..i64::MAX / 2, slide in 1i64..1_000_000_000) {
            let specs = [
                WindowSpec::Tumbling { size, offset: 0 },
                WindowSpec::Sliding { size: slide.max(size.min(slide * 3)), slide, offset: 0 },
                WindowSpec::Session { gap: size },
            ];
            for spec in specs {
                for w in spec.assign(t) {
                    prop_assert!(w.start <= w.end);
                }
            }
        }
    }
}
