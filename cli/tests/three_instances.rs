//! Three `tidemark run` instances in one consumer group under
//! `exactly_once`; one is killed with SIGKILL mid-stream. Its partitions move
//! to the survivors, which restore its state from the changelog, and the
//! output holds every window exactly once.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PER_PARTITION: i64 = 600;
const KEYS: i64 = 5;
const PARTITIONS: i32 = 6;

fn instance(file: &std::path::Path, id: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .env("TIDEMARK_INSTANCE_ID", id)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_killed_instance_hands_its_partitions_and_state_to_the_survivors() {
    let (input, output, group) = (unique("trio-in"), unique("trio-out"), unique("trio-app"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("template.yaml");
    std::fs::write(
        &file,
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
      aggregates: [{{fn: count, as: n}}]
output_mode: append
trigger: {{micro_batch: 200 milliseconds}}
max_records_per_batch: 50
sink: {{kind: kafka, topic: {output}, key: [id]}}
state: {{dir: state, changelog: true, memory_mb: 32}}
processing_guarantee: exactly_once
"#
        ),
    )
    .unwrap();
    // Each instance keeps its state in its own directory, as on separate
    // machines: a moved partition can only come back through the changelog.
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let files: Vec<_> = dirs
        .iter()
        .map(|d| {
            let f = d.path().join("pipeline.yaml");
            std::fs::copy(&file, &f).unwrap();
            f
        })
        .collect();
    let mut instances: Vec<Child> = (0..3)
        .map(|i| instance(&files[i], &format!("i{i}")))
        .collect();
    std::thread::sleep(Duration::from_secs(3));

    // Produce while the three run, half the stream, then kill one.
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    let produce_range = |from: i64, to: i64| {
        for p in 0..PARTITIONS {
            let records: Vec<_> = (from..to)
                .map(|i| {
                    let id = format!("p{p}-{}", i % KEYS);
                    let t = tidemark::time::format_rfc3339(start + i * 1_000_000);
                    (
                        id.clone(),
                        format!(r#"{{"event_time": "{t}", "id": "{id}", "amount": 1}}"#)
                            .into_bytes(),
                    )
                })
                .collect();
            produce_to(&input, Some(p), &records);
        }
    };
    produce_range(0, PER_PARTITION / 2);
    std::thread::sleep(Duration::from_secs(4));
    instances[1].kill().unwrap();
    instances[1].wait().unwrap();
    produce_range(PER_PARTITION / 2, PER_PARTITION);

    // Each partition's watermark ends at 10:09:29: nine windows per key.
    let expected_rows = PARTITIONS as usize * 9 * KEYS as usize;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline
        && consume_all(&output, expected_rows, Duration::from_secs(10)).len() < expected_rows
    {}
    for i in [0, 2] {
        let _ = Command::new("kill")
            .args(["-INT", &instances[i].id().to_string()])
            .status();
        instances[i].wait().unwrap();
    }
    let out = consume_all(&output, expected_rows, Duration::from_secs(10));
    let mut seen: BTreeMap<(String, String), i64> = BTreeMap::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let key = (
            v["id"].as_str().unwrap().to_string(),
            v["window_start"].as_str().unwrap().to_string(),
        );
        let n = v["n"].as_i64().unwrap();
        assert!(
            seen.insert(key.clone(), n).is_none(),
            "duplicate window {key:?}"
        );
        assert_eq!(n, 12, "{key:?}");
    }
    assert_eq!(seen.len(), expected_rows);
}
