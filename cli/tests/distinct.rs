//! `distinct` over a topic of two partitions (#44): one of each row per
//! task, so the same row in both partitions would come out twice. Records
//! keyed by a column of the row put equal rows in one partition, and then
//! `distinct` is exact; without that (`keyed_by` unset) the run is refused
//! with an error naming `distinct` and the fix, rather than answer wrongly.

mod common;

use common::*;
use std::time::Duration;
use tidemark_integration_tests::*;

fn pipeline(app: &str, input: &str, output: &str, keyed_by: &str) -> String {
    format!(
        r#"name: {app}
source:
  kind: kafka
  topic: {input}{keyed_by}
  schema: {{event_time: timestamp, id: string}}
event_time: event_time
watermark: 10 seconds
steps:
  - distinct: {{}}
output_mode: append
trigger: available_now
sink: {{kind: kafka, topic: {output}}}
"#
    )
}

/// Each of three rows twice: once in each partition when `scattered`
/// (keyed at random), else both copies under the key `id` (one partition).
fn produce_rows(input: &str, scattered: bool) {
    let records: Vec<_> = (0..2)
        .flat_map(|copy| {
            ["a", "b", "c"].map(|id| {
                let value = format!(r#"{{"event_time": "2026-01-01T10:00:00Z", "id": "{id}"}}"#);
                let partition = if scattered {
                    copy
                } else {
                    i32::from(id == "b")
                };
                (Some(partition), id.to_string(), value.into_bytes())
            })
        })
        .collect();
    produce_each_with(&plain(), input, &records);
}

/// Runs the `distinct` pipeline (`keyed_by` its extra source lines) to its
/// end over [`produce_rows`]; returns the run and the output topic.
fn run_distinct(scattered: bool, keyed_by: &str) -> (std::process::Output, String) {
    let (input, output, app) = (
        unique("distinct-in"),
        unique("distinct-out"),
        unique("distinct"),
    );
    create_topic(&input, 2);
    create_topic(&output, 1);
    produce_rows(&input, scattered);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&app, &input, &output, keyed_by)).unwrap();
    (run_to_end(&file), output)
}

#[test]
fn distinct_on_records_not_keyed_by_columns_of_two_partitions_is_refused() {
    let (run, output) = run_distinct(true, "");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "a wrong answer was run: {stderr}");
    assert!(
        stderr.contains("steps[].distinct") && stderr.contains("keyed_by"),
        "the error names `distinct` and the fix: {stderr}"
    );
    assert!(
        consume_all(&output, 1, Duration::from_secs(3)).is_empty(),
        "nothing was written"
    );
}

#[test]
fn distinct_on_records_keyed_by_a_column_keeps_one_of_each_row() {
    let (run, output) = run_distinct(false, "\n  keyed_by: [id]");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut ids: Vec<String> = consume_all(&output, 3, Duration::from_secs(10))
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            v["id"].as_str().unwrap().to_string()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["a", "b", "c"]);
}
