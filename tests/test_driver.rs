//! The in-process test driver runs a conformance scenario's pipeline file
//! over its batches and gives the rows, late rows and progress Spark gives.

use std::path::Path;

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Sorted JSON texts, so that order within the run does not matter.
fn sorted(values: impl IntoIterator<Item = serde_json::Value>) -> Vec<String> {
    let mut out: Vec<String> = values.into_iter().map(|v| v.to_string()).collect();
    out.sort();
    out
}

#[test]
fn a_union_scenario_fed_batch_by_batch_gives_sparks_rows_late_rows_and_watermarks() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/union-fast-and-lagging-max");
    let text = std::fs::read_to_string(dir.join("pipeline.yaml")).unwrap();
    let mut driver = tidemark_pipeline::test_driver(&text).unwrap();
    for batch in 0..5 {
        driver = driver.batch_at(&format!("2026-01-01T12:0{batch}:00Z"));
        for stream in ["us", "eu"] {
            for line in lines(&dir.join(format!("batches/{stream}/00{batch}.jsonl"))) {
                driver = driver.pipe(stream, &line);
            }
        }
    }
    let run = driver.run().unwrap();
    let parse = |l: String| serde_json::from_str::<serde_json::Value>(&l).unwrap();
    let expected = sorted(lines(&dir.join("expected.jsonl")).into_iter().map(parse));
    assert_eq!(sorted(run.output_json()), expected);
    let expected_late = sorted(
        lines(&dir.join("expected_late.jsonl"))
            .into_iter()
            .map(parse),
    );
    assert_eq!(sorted(run.late_json()), expected_late);
    assert_eq!(run.progress.len(), 6, "five batches and the no-data batch");
    let watermark = |batch: usize| run.progress[batch].event_time.get("watermark").cloned();
    assert_eq!(watermark(4).as_deref(), Some("2026-01-01T10:38:00Z"));
    assert_eq!(
        run.progress[2].stream_watermarks.len(),
        2,
        "{:?}",
        run.progress[2]
    );
    assert!(run.dead_letters.is_empty());
}

#[test]
fn partitions_fed_apart_are_tasks_of_their_own_and_a_query_wide_watermark_spans_them() {
    let text = |scope: &str| {
        format!(
            r#"
name: scope
source: {{kind: kafka, topic: events, schema: {{t: timestamp, id: string}}}}
event_time: t
watermark: 5 minutes
watermark_scope: {scope}
steps:
  - window_aggregate: {{keys: [id], window: {{tumbling: 5 minutes}}, aggregates: [{{fn: count, as: n}}]}}
output_mode: append
sink: {{kind: stdout}}
"#
        )
    };
    let run = |scope: &str| {
        tidemark_pipeline::test_driver(&text(scope))
            .unwrap()
            .batch_at("2026-01-01T11:00:00Z")
            .pipe_to(
                "events",
                0,
                Some("a"),
                r#"{"t": "2026-01-01T10:20:00Z", "id": "a"}"#,
            )
            .batch_at("2026-01-01T11:01:00Z")
            .pipe_to(
                "events",
                1,
                Some("b"),
                r#"{"t": "2026-01-01T10:01:00Z", "id": "b"}"#,
            )
            .batch_at("2026-01-01T11:02:00Z")
            .pipe_to(
                "events",
                1,
                Some("b"),
                r#"{"t": "2026-01-01T10:30:00Z", "id": "b"}"#,
            )
            .run()
            .unwrap()
    };
    // Query-wide: 10:15 after batch 0, in effect for batch 1's threshold
    // only from batch 2; batch 1's row is judged by batch 0's (none).
    let query = run("query");
    assert_eq!(query.late_rows.len(), 0);
    let b_windows = |r: &tidemark::test_driver::TestRun| {
        r.output_json()
            .into_iter()
            .filter(|v| v["id"] == "b")
            .map(|v| (v["batch_id"].as_u64().unwrap(), v["n"].as_i64().unwrap()))
            .collect::<Vec<_>>()
    };
    // b's 10:00 window closes in batch 1 already under `query` (10:15 in
    // effect); per partition only once partition 1's own watermark, 10:25,
    // takes effect in the no-data batch after batch 2.
    assert_eq!(b_windows(&query), [(1, 1)]);
    assert_eq!(b_windows(&run("partition")), [(3, 1)]);
}

/// A stream–table join takes no part in the watermark: windows after it
/// close as the stream's event time moves (the watermark used to wait for
/// a stream the table never reports).
#[test]
fn windows_after_a_table_join_close_as_the_stream_moves() {
    let run = tidemark_pipeline::test_driver(
        r#"
name: enriched
source: {kind: kafka, topic: events, keyed_by: [id], schema: {t: timestamp, id: string}}
event_time: t
watermark: 0 seconds
steps:
  - table_join: {topic: users, type: left_outer, on: [id], schema: {id: string, name: string}}
  - window_aggregate: {keys: [id, name], window: {tumbling: 5 minutes}, aggregates: [{fn: count, as: n}]}
output_mode: append
sink: {kind: stdout}
"#,
    )
    .unwrap()
    .batch_at("2026-01-01T11:00:00Z")
    .pipe("users", r#"{"id": "a", "name": "Ann"}"#)
    .pipe("events", r#"{"t": "2026-01-01T10:01:00Z", "id": "a"}"#)
    .pipe("events", r#"{"t": "2026-01-01T10:20:00Z", "id": "a"}"#)
    .run()
    .unwrap();
    let first: Vec<serde_json::Value> = run.output_json().into_iter().take(1).collect();
    assert_eq!(
        first,
        [serde_json::json!({"batch_id": 1, "id": "a", "name": "Ann",
            "window_start": "2026-01-01T10:00:00Z", "window_end": "2026-01-01T10:05:00Z", "n": 1})]
    );
}
