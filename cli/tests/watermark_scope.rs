//! Spark's query-wide watermark against the per-partition one, on a
//! two-partition topic whose partitions are out of step: partition 0 (key
//! `a`) runs to 10:20 while partition 1 (key `b`) has sent nothing; then
//! `b` sends rows of 10:01 and 10:02. Under `watermark_scope: query` (one
//! watermark over every partition, as Spark computes it) they are behind
//! the 10:15 watermark and dropped as late; under `partition` (Kafka
//! Streams' stream time) partition 1 has its own watermark and counts them.

mod common;

use common::{interrupt, start_replica, wait_for_records};
use std::time::Duration;
use tidemark_integration_tests::*;

fn pipeline(app: &str, input: &str, output: &str, scope: &str) -> String {
    format!(
        r#"application_id: {app}
source:
  kind: kafka
  topic: {input}
  group: {app}
  keyed_by: [id]
  format: json
  schema: {{event_time: timestamp, id: string}}
event_time: event_time
watermark: 5 minutes
watermark_scope: {scope}
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 5 minutes}}
      aggregates: [{{fn: count, as: n}}]
output_mode: append
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}, format: json}}
state_dir: state
"#
    )
}

fn rows(id: &str, minutes: &[&str]) -> Vec<(String, Vec<u8>)> {
    minutes
        .iter()
        .map(|m| {
            let value = format!(r#"{{"event_time": "2026-01-01T{m}:00Z", "id": "{id}"}}"#);
            (id.to_string(), value.into_bytes())
        })
        .collect()
}

/// Runs the scenario under `scope`; returns each emitted `(id, window
/// start, count)`.
fn run(scope: &str) -> Vec<(String, String, i64)> {
    let (input, output, app) = (unique("ws-in"), unique("ws-out"), unique("ws-app"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&app, &input, &output, scope)).unwrap();
    let mut replica = start_replica(&file);
    let a: Vec<String> = (0..=20).map(|m| format!("10:{m:02}")).collect();
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    produce_to(&input, Some(0), &rows("a", &a));
    // a's windows up to 10:15 close on partition 0's watermark, 10:15.
    wait_for_records(&output, 3);
    produce_to(&input, Some(1), &rows("b", &["10:01", "10:02", "10:30"]));
    // Moves every watermark past b's rows and the 10:30 window.
    std::thread::sleep(Duration::from_secs(2));
    produce_to(&input, Some(0), &rows("a", &["10:45"]));
    produce_to(&input, Some(1), &rows("b", &["10:45"]));
    // a: 10:15, 10:20; b: 10:30, and 10:00 only per partition.
    let expected = if scope == "query" { 6 } else { 7 };
    wait_for_records(&output, expected);
    std::thread::sleep(Duration::from_secs(2));
    interrupt(&mut replica.child);
    let mut out: Vec<_> = consume_all(&output, expected, Duration::from_secs(10))
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            (
                v["id"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap()[11..16].to_string(),
                v["n"].as_i64().unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

fn windows(rows: &[(&str, &str, i64)]) -> Vec<(String, String, i64)> {
    rows.iter()
        .map(|(id, start, n)| (id.to_string(), start.to_string(), *n))
        .collect()
}

#[test]
fn query_scope_drops_a_lagging_partitions_rows_as_spark_does_and_partition_scope_keeps_them() {
    let a = [
        ("a", "10:00", 5),
        ("a", "10:05", 5),
        ("a", "10:10", 5),
        ("a", "10:15", 5),
        ("a", "10:20", 1),
    ];
    let mut query = windows(&a);
    query.push(("b".into(), "10:30".into(), 1));
    assert_eq!(run("query"), query, "Spark: b's 10:01 and 10:02 are late");
    let mut partition = windows(&a);
    partition.extend(windows(&[("b", "10:00", 2), ("b", "10:30", 1)]));
    partition.sort();
    assert_eq!(run("partition"), partition);
}
