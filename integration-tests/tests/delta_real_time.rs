//! A rolling window in real-time mode writing a Delta upsert table through
//! a real broker: the table's latest version, read by the Python
//! `deltalake` package, holds one row per key with its current values,
//! after several sub-second commits.

use std::time::{Duration, Instant};
use tidemark::runtime::StopHandle;
use tidemark_integration_tests::*;
use tidemark_pipeline::PipelineFile;

fn payment(card: &str, amount: i64) -> (String, Vec<u8>) {
    let now_ms = tidemark::time::now_micros() / 1000;
    let value = serde_json::json!({"ts": now_ms, "card": card, "amount": amount});
    (card.to_string(), value.to_string().into_bytes())
}

/// Card → (lifetime count, lifetime sum) in the table's rows.
fn current(table: &serde_json::Value) -> std::collections::BTreeMap<String, (i64, i64)> {
    table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["card"].as_str().unwrap().to_string(),
                (r["n"].as_i64().unwrap(), r["total"].as_i64().unwrap()),
            )
        })
        .collect()
}

#[test]
fn a_real_time_rolling_window_keeps_an_upsert_table_current() {
    let (input, app) = (unique("card-payments"), unique("features"));
    create_topic(&input, 1);
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"name: {app}
source: {{kind: kafka, topic: {input}, schema: {{ts: long, card: string, amount: long}}}}
event_time: ts
steps:
  - rolling_window:
      partition_by: [card]
      measures:
        - {{fn: count, column: amount, as: n}}
        - {{fn: sum, column: amount, as: total}}
        - {{fn: sum, column: amount, range: 1 hour, as: total_1h}}
output_mode: update
trigger: {{real_time: 1 minute}}
sink: {{kind: delta, path: features, mode: upsert, commit_interval: 300 milliseconds}}
"#
    );
    let file = PipelineFile::parse(&yaml).unwrap();
    let connected = tidemark_connectors::connect(&file, dir.path()).unwrap();
    let (query, mut source, mut sink) = connected.wire(file.query_builder().unwrap());
    let stop = StopHandle::default();
    let query = query.build().unwrap().with_stop_handle(stop.clone());
    let run = std::thread::spawn(move || query.run(source.as_mut(), sink.as_mut()).unwrap());

    let mut expected = std::collections::BTreeMap::new();
    for round in 0..4i64 {
        let records: Vec<_> = (0..5)
            .map(|c| {
                let card = format!("card-{c}");
                let amount = 10 * (c + 1) + round;
                let slot = expected.entry(card.clone()).or_insert((0i64, 0i64));
                slot.0 += 1;
                slot.1 += amount;
                payment(&card, amount)
            })
            .collect();
        produce(&input, &records);
        std::thread::sleep(Duration::from_millis(700));
    }
    let table_path = dir.path().join("features");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut table = serde_json::Value::Null;
    while Instant::now() < deadline {
        if table_path.join("_delta_log").exists() {
            table = read_delta(&table_path, None);
            if current(&table) == expected {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.stop();
    run.join().unwrap();
    assert_eq!(current(&table), expected, "{table}");
    let rows = table["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "one row per card: {table}");
    for row in rows {
        assert_eq!(
            row["total_1h"], row["total"],
            "every payment is within the hour"
        );
    }
    assert!(
        table["version"].as_i64().unwrap() >= 3,
        "several commits while the batch ran: {table}"
    );
}
