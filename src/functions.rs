//! Aggregates and windows as functions, written as Spark's
//! `org.apache.spark.sql.functions` writes them:
//!
//! ```
//! use std::time::Duration;
//! use tidemark::functions::{approx_percentile, avg, count, sum, tumbling};
//! use tidemark::runtime::Query;
//!
//! let query = Query::builder("readings")
//!     .event_time("ts")
//!     .watermark("1 minute")?
//!     .window_aggregate(
//!         ["sensor"],
//!         tumbling(Duration::from_secs(300))?,
//!         vec![
//!             count().alias("readings"),
//!             avg("value"),
//!             sum("value").alias("total"),
//!             approx_percentile("value", 0.99).alias("p99"),
//!         ],
//!     )
//!     .build()?;
//! # Ok::<(), tidemark::Error>(())
//! ```
//!
//! An aggregate is named as Spark names it (`avg(value)`, `count` for
//! `count()`) until [`AggregateSpec::alias`] renames it. Window lengths are
//! a [`std::time::Duration`] or Spark's text (`"5 minutes"`); either is
//! checked when the window is made (positive, a slide no longer than its
//! window), with the same errors as the pipeline file's.

use crate::aggregate::AggregateFn;
use crate::error::Result;
use crate::operators::{AggregateInput, AggregateSpec};
use crate::window::WindowSpec;
use std::sync::Arc;
use std::time::Duration;

/// A length of time a window takes: a [`Duration`], or Spark's text
/// (`"10 minutes"`, `"1 hour 30 minutes"`, `"250 milliseconds"`).
pub trait WindowLength {
    /// The length as Spark's duration text.
    fn as_duration_text(&self) -> String;
}

impl WindowLength for Duration {
    fn as_duration_text(&self) -> String {
        format!("{} microseconds", self.as_micros())
    }
}

impl WindowLength for &str {
    fn as_duration_text(&self) -> String {
        (*self).to_string()
    }
}

impl WindowLength for String {
    fn as_duration_text(&self) -> String {
        self.clone()
    }
}

/// Tumbling windows of `size`: Spark's `window(ts, size)`.
pub fn tumbling(size: impl WindowLength) -> Result<WindowSpec> {
    WindowSpec::tumbling(&size.as_duration_text())
}

/// Windows of `size` starting every `slide`: Spark's
/// `window(ts, size, slide)`.
pub fn sliding(size: impl WindowLength, slide: impl WindowLength) -> Result<WindowSpec> {
    WindowSpec::sliding(&size.as_duration_text(), &slide.as_duration_text())
}

/// Session windows closed after `gap` without a row: Spark's
/// `session_window(ts, gap)`.
pub fn session(gap: impl WindowLength) -> Result<WindowSpec> {
    WindowSpec::session(&gap.as_duration_text())
}

/// The built-in aggregate `name`: only this module's own names reach it
/// (each tested), never a caller's text.
fn built_in(name: &str) -> AggregateFn {
    AggregateFn::built_in(name).expect("the functions module names built-in aggregates")
}

/// A built-in aggregate of `column`, named `name(column)`.
fn of_column(name: &str, column: &str) -> AggregateSpec {
    AggregateSpec::new(built_in(name), AggregateInput::Column(Arc::from(column)))
}

/// `count(*)`: every row, named `count`.
pub fn count() -> AggregateSpec {
    AggregateSpec::count()
}

/// `count(column)`: the rows whose `column` is not null.
pub fn count_of(column: &str) -> AggregateSpec {
    of_column("count", column)
}

/// `sum(column)`.
pub fn sum(column: &str) -> AggregateSpec {
    of_column("sum", column)
}

/// `avg(column)`.
pub fn avg(column: &str) -> AggregateSpec {
    of_column("avg", column)
}

/// `min(column)`.
pub fn min(column: &str) -> AggregateSpec {
    of_column("min", column)
}

/// `max(column)`.
pub fn max(column: &str) -> AggregateSpec {
    of_column("max", column)
}

/// `stddev(column)`: the sample standard deviation.
pub fn stddev(column: &str) -> AggregateSpec {
    of_column("stddev", column)
}

/// `variance(column)`: the sample variance.
pub fn variance(column: &str) -> AggregateSpec {
    of_column("variance", column)
}

/// `max_by(value, ordering)`: `value` of the row with the largest
/// `ordering`.
pub fn max_by(value: &str, ordering: &str) -> AggregateSpec {
    by("max_by", value, ordering)
}

/// `min_by(value, ordering)`: `value` of the row with the smallest
/// `ordering`.
pub fn min_by(value: &str, ordering: &str) -> AggregateSpec {
    by("min_by", value, ordering)
}

fn by(name: &str, value: &str, ordering: &str) -> AggregateSpec {
    AggregateSpec::new(
        built_in(name),
        AggregateInput::By {
            value: Arc::from(value),
            ordering: Arc::from(ordering),
        },
    )
}

/// `approx_count_distinct(column)`, with Spark's default relative
/// standard deviation, 0.05.
pub fn approx_count_distinct(column: &str) -> AggregateSpec {
    AggregateSpec::new(
        AggregateFn::approx_count_distinct(0.05),
        AggregateInput::Column(Arc::from(column)),
    )
}

/// `approx_percentile(column, percentage)`, with Spark's default
/// accuracy, 10,000.
pub fn approx_percentile(column: &str, percentage: f64) -> AggregateSpec {
    AggregateSpec::new(
        AggregateFn::approx_percentile(percentage, 10_000),
        AggregateInput::Column(Arc::from(column)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_are_named_as_spark_names_them() {
        let names: Vec<String> = [
            count(),
            count_of("id"),
            sum("amount"),
            avg("amount"),
            min("amount"),
            max("amount"),
            stddev("amount"),
            variance("amount"),
            max_by("auction", "price"),
            approx_count_distinct("user"),
            approx_percentile("latency", 0.99),
            sum("amount").alias("total"),
        ]
        .iter()
        .map(|a| a.output.to_string())
        .collect();
        assert_eq!(
            names,
            [
                "count",
                "count(id)",
                "sum(amount)",
                "avg(amount)",
                "min(amount)",
                "max(amount)",
                "stddev(amount)",
                "variance(amount)",
                "max_by(auction, price)",
                "approx_count_distinct(user)",
                "approx_percentile(latency)",
                "total"
            ]
        );
        assert_eq!(
            count_of("id").input,
            AggregateInput::Column(Arc::from("id"))
        );
        assert_eq!(count().input, AggregateInput::Star);
    }

    #[test]
    fn windows_take_a_duration_or_sparks_text_alike() {
        assert_eq!(
            tumbling(Duration::from_secs(300)).unwrap(),
            tumbling("5 minutes").unwrap()
        );
        assert_eq!(
            sliding(Duration::from_secs(600), "5 minutes").unwrap(),
            WindowSpec::sliding("10 minutes", "5 minutes").unwrap()
        );
        assert_eq!(
            session(Duration::from_millis(1500)).unwrap(),
            WindowSpec::session("1500 milliseconds").unwrap()
        );
        // The same checks as the pipeline file's, naming the key.
        let zero = tumbling(Duration::ZERO).unwrap_err().to_string();
        assert!(zero.contains("window.tumbling"), "{zero}");
        let slide = sliding("1 minute", "2 minutes").unwrap_err().to_string();
        assert!(slide.contains("window.slide"), "{slide}");
        assert!(tumbling("five minutes").is_err());
    }
}
