//! Benchmarks for tidemark: the end-to-end Kafka harness (`src/bin/e2e.rs`)
//! and the criterion operator benchmarks (`benches/operators.rs`).
//!
//! This library holds what both share: the synthetic input records (the same
//! payloads are produced to Kafka by the harness and decoded in memory by the
//! criterion benchmarks), the schema and the filter condition.
//!
//! ```
//! let p = tidemark_bench::payload(9, 100);
//! let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
//! assert!(v["amount"].as_f64().unwrap() < 0.0);
//! assert_eq!(p.len(), 100);
//! ```
#![warn(missing_docs)]

pub mod nexmark;

use tidemark::schema::{FieldType, Schema};
use tidemark::time::TimestampMicros;

/// The filter condition of the benchmarked pipeline: drops the 10% of
/// records with a negative amount.
pub const FILTER: &str = "amount >= 0";

/// Distinct customer ids (`c0` .. `c999`); also the record keys.
pub const DISTINCT_IDS: u64 = 1_000;

/// The event time of the first record: 2026-01-01T00:00:00Z.
pub const START_MICROS: TimestampMicros = 1_767_225_600_000_000;

/// The schema the pipeline decodes with: `event_time` timestamp, `id`
/// string, `amount` double (`pad` is not listed and so not kept).
pub fn schema() -> Schema {
    Schema::new([
        ("event_time", FieldType::Timestamp),
        ("id", FieldType::String),
        ("amount", FieldType::Double),
    ])
}

/// [`schema`] as Apache Arrow types: event time as UTC microseconds, `id`
/// as UTF-8, `amount` as a 64-bit float, all nullable.
pub fn arrow_schema() -> std::sync::Arc<deltalake::arrow::datatypes::Schema> {
    use deltalake::arrow::datatypes::{DataType, Field, Schema as ArrowSchema, TimeUnit};
    std::sync::Arc::new(ArrowSchema::new(vec![
        Field::new(
            "event_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("id", DataType::Utf8, true),
        Field::new("amount", DataType::Float64, true),
    ]))
}

/// Whether record `i` has a negative amount: one record in ten.
pub fn is_negative(i: u64) -> bool {
    i % 10 == 9
}

/// How many of records `0..records` pass [`FILTER`].
pub fn expected_kept(records: u64) -> u64 {
    records - records / 10
}

/// The customer id of record `i`, also used as its Kafka key.
pub fn id(i: u64) -> String {
    format!("c{}", i % DISTINCT_IDS)
}

/// The event time of record `i`: one record per millisecond from
/// [`START_MICROS`].
pub fn event_time(i: u64) -> TimestampMicros {
    START_MICROS + i as TimestampMicros * 1_000
}

/// The JSON value of record `i`, padded with a `pad` string to about
/// `value_bytes` bytes (never less than the unpadded object):
/// `{"event_time": "2026-01-01T00:00:00.009Z", "id": "c9", "amount": -4.75, "pad": "xx.."}`.
pub fn payload(i: u64, value_bytes: usize) -> Vec<u8> {
    let magnitude = (i % 997) as f64 * 0.25 + 0.5;
    let amount = if is_negative(i) {
        -magnitude
    } else {
        magnitude
    };
    let head = format!(
        r#"{{"event_time": "{}", "id": "{}", "amount": {amount:?}, "pad": ""#,
        tidemark::time::format_rfc3339(event_time(i)),
        id(i),
    );
    let tail = "\"}";
    let pad = value_bytes.saturating_sub(head.len() + tail.len());
    let mut out = Vec::with_capacity(head.len() + pad + tail.len());
    out.extend_from_slice(head.as_bytes());
    out.resize(out.len() + pad, b'x');
    out.extend_from_slice(tail.as_bytes());
    out
}

/// The number of CPUs this process may use (`nproc`).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPU model from `/proc/cpuinfo`, if readable.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The cargo profile this binary was built with (`dev` or `release`).
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    }
}

/// The process's peak resident memory (`VmHWM`) in MiB; 0 where unknown.
pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A decoder with the engine's columnar route closed (it gives no typed
/// schema): the row route, to compare with the columns in one run.
pub struct RowsOnly<D>(pub D);

impl<D: tidemark::runtime::Decoder> tidemark::runtime::Decoder for RowsOnly<D> {
    fn decode(
        &mut self,
        record: &tidemark::record::Record,
    ) -> tidemark::Result<tidemark::row::Row> {
        self.0.decode(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_valid_json_of_the_requested_size() {
        for i in 0..1_000 {
            let p = payload(i, 100);
            assert_eq!(p.len(), 100);
            let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
            assert_eq!(v["amount"].as_f64().unwrap() < 0.0, is_negative(i));
            assert_eq!(v["id"], id(i));
        }
    }

    #[test]
    fn expected_kept_counts_non_negative_records() {
        for n in [0, 1, 9, 10, 11, 19, 20, 1_000, 300_001] {
            let by_hand = (0..n).filter(|i| !is_negative(*i)).count() as u64;
            assert_eq!(expected_kept(n), by_hand, "n = {n}");
        }
    }

    #[test]
    fn start_is_2026() {
        assert_eq!(
            tidemark::time::format_rfc3339(START_MICROS),
            "2026-01-01T00:00:00Z"
        );
    }
}
