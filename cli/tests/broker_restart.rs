//! The broker restarts in the middle of an exactly-once windowed run; the
//! running `tidemark` recovers by itself and the output is exact. Runs only
//! against the broker that `scripts/kafka.sh` manages (it restarts it).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const KEYS: i64 = 5;
const PARTITIONS: i32 = 2;

fn kafka_script(command: &str) -> bool {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka.sh");
    Command::new("bash")
        .arg(script)
        .arg(command)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn a_broker_restart_mid_run_is_survived_with_exact_results() {
    if !kafka_script("status") {
        eprintln!("skipped: the broker is not managed by scripts/kafka.sh, so it cannot be restarted here");
        return;
    }
    let (input, output, group) = (
        unique("restart-in"),
        unique("restart-out"),
        unique("restart-app"),
    );
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
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
    let mut app = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
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
    produce_range(0, 300);
    std::thread::sleep(Duration::from_secs(3));
    assert!(kafka_script("stop"), "stopping the broker");
    std::thread::sleep(Duration::from_secs(3));
    assert!(kafka_script("start"), "starting the broker again");
    produce_range(300, 600);

    let expected_rows = PARTITIONS as usize * 9 * KEYS as usize;
    let deadline = Instant::now() + Duration::from_secs(150);
    while Instant::now() < deadline
        && consume_all(&output, expected_rows, Duration::from_secs(10)).len() < expected_rows
    {}
    let _ = Command::new("kill")
        .args(["-INT", &app.id().to_string()])
        .status();
    let status = app.wait().unwrap();
    let out = consume_all(&output, expected_rows, Duration::from_secs(10));
    let mut seen: BTreeMap<(String, String), i64> = BTreeMap::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let key = (
            v["id"].as_str().unwrap().to_string(),
            v["window_start"].as_str().unwrap().to_string(),
        );
        assert!(
            seen.insert(key.clone(), v["n"].as_i64().unwrap()).is_none(),
            "duplicate window {key:?}"
        );
    }
    assert_eq!(seen.len(), expected_rows, "{seen:?}");
    assert!(seen.values().all(|n| *n == 12), "{seen:?}");
    assert!(
        status.success(),
        "the app kept running and stopped cleanly on Ctrl-C: {status:?}"
    );
}
