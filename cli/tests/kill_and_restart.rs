//! `tidemark run` killed with SIGKILL in the middle of a windowed pipeline
//! under `exactly_once`, twice, then restarted: the output topic read
//! `read_committed` holds exactly the expected windows, once each.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PER_PARTITION: i64 = 600;
const KEYS: i64 = 5;

fn pipeline(group: &str, input: &str, output: &str, trigger: &str) -> String {
    format!(
        r#"name: {group}
source:
  kind: kafka
  topic: {input}
  schema: {{event_time: timestamp, id: string, amount: double}}
  properties: {{session.timeout.ms: "6000", heartbeat.interval.ms: "1000"}}
event_time: event_time
watermark: 30 seconds
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 minute}}
      aggregates: [{{fn: count, as: n}}, {{fn: sum, column: amount, as: total}}]
output_mode: append
trigger: {trigger}
max_records_per_batch: 100
sink: {{kind: kafka, topic: {output}, key: [id]}}
state: {{dir: state, changelog: true, memory_mb: 32}}
processing_guarantee: exactly_once
"#
    )
}

/// Runs `tidemark run` until it has reported `batches` progress lines, then
/// kills it with SIGKILL.
fn run_and_kill(file: &std::path::Path, batches: usize) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", "--progress", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = 0;
    for line in stderr.lines() {
        let line = line.unwrap();
        if line.starts_with('{') && line.contains("\"batchId\"") {
            seen += 1;
        }
        if seen >= batches || Instant::now() > deadline {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(seen >= batches, "only {seen} batches before the deadline");
}

#[test]
fn sigkill_twice_under_exactly_once_then_the_output_is_exact() {
    let (input, output, group) = (unique("eos-in"), unique("eos-out"), unique("eos-app"));
    create_topic(&input, 4);
    create_topic(&output, 1);
    // Partition p: one event a second for 10 minutes, keys p-0..p-4 in turn.
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    for p in 0..4 {
        let records: Vec<_> = (0..PER_PARTITION)
            .map(|i| {
                let id = format!("p{p}-{}", i % KEYS);
                let t = tidemark::time::format_rfc3339(start + i * 1_000_000);
                (
                    id.clone(),
                    format!(r#"{{"event_time": "{t}", "id": "{id}", "amount": 1.5}}"#).into_bytes(),
                )
            })
            .collect();
        produce_to(&input, Some(p), &records);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        pipeline(&group, &input, &output, "{micro_batch: 200 milliseconds}"),
    )
    .unwrap();
    run_and_kill(&file, 4);
    run_and_kill(&file, 6);
    std::fs::write(&file, pipeline(&group, &input, &output, "available_now")).unwrap();
    let done = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );

    // Each partition's watermark ends at 10:09:59 - 30 s = 10:09:29: the nine
    // windows 10:00..10:09 closed, each with 12 events per key.
    let expected_rows = 4 * 9 * KEYS as usize;
    let out = consume_all(&output, expected_rows, Duration::from_secs(60));
    let mut seen: BTreeMap<(String, String), (i64, f64)> = BTreeMap::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let key = (
            v["id"].as_str().unwrap().to_string(),
            v["window_start"].as_str().unwrap().to_string(),
        );
        let value = (v["n"].as_i64().unwrap(), v["total"].as_f64().unwrap());
        if let Some(previous) = seen.insert(key.clone(), value) {
            let all: Vec<String> = out
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    format!(
                        "#{i} {}",
                        String::from_utf8_lossy(r.value.as_deref().unwrap())
                    )
                })
                .collect();
            panic!(
                "duplicate window {key:?}: {previous:?} then {value:?}; output in order:\n{}",
                all.join("\n")
            );
        }
    }
    assert_eq!(seen.len(), expected_rows, "windows: {seen:?}");
    for (key, (n, total)) in &seen {
        assert_eq!((*n, *total), (12, 18.0), "{key:?}");
    }
}
