//! The real-time trigger on a real broker: a rolling window emits a key's
//! row as each of its events arrives and again as each leaves the range,
//! long before the batch's checkpoint.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::progress::QueryProgress;
use tidemark::runtime::StopHandle;
use tidemark_integration_tests::*;
use tidemark_pipeline::PipelineFile;

fn payment(card: &str, amount: i64) -> (String, Vec<u8>) {
    let now_ms = tidemark::time::now_micros() / 1000;
    let value = serde_json::json!({"ts": now_ms, "card": card, "amount": amount});
    (card.to_string(), value.to_string().into_bytes())
}

fn rows_of(rows: &[Consumed], card: &str) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|r| serde_json::from_slice::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap())
        .filter(|v| v["card"] == card)
        .collect()
}

#[test]
fn rows_appear_as_events_arrive_and_again_as_they_leave_the_range() {
    let (input, output, app) = (unique("payments"), unique("features"), unique("rt"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    // A checkpoint a minute: every row below is written within that
    // minute, so none of them waited for a batch to end.
    let yaml = format!(
        r#"name: {app}
source:
  kind: kafka
  topic: {input}
  schema: {{ts: long, card: string, amount: long}}
event_time: ts
steps:
  - rolling_window:
      partition_by: [card]
      frontier: {{delay: 0 seconds, alias: frontier}}
      measures:
        - {{fn: sum, column: amount, range: 5 seconds, as: sum_5s}}
        - {{fn: count, column: amount, as: n}}
output_mode: update
trigger: {{real_time: 1 minute}}
sink: {{kind: kafka, topic: {output}, key: [card]}}
"#
    );
    let file = PipelineFile::parse(&yaml).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let connected = tidemark_connectors::connect(&file, dir.path()).unwrap();
    let (query, mut source, mut sink) = connected.wire(file.query_builder().unwrap());
    let reports = Arc::new(Mutex::new(Vec::<QueryProgress>::new()));
    let seen = reports.clone();
    let stop = StopHandle::default();
    let query = query
        .on_progress(move |p: &QueryProgress| seen.lock().unwrap().push(p.clone()))
        .build()
        .unwrap()
        .with_stop_handle(stop.clone());
    let started = std::time::Instant::now();
    let run = std::thread::spawn(move || query.run(source.as_mut(), sink.as_mut()).unwrap());

    // A first event shows the query is reading.
    produce(&input, &[payment("c0", 1)]);
    let out = consume_until(&output, Duration::from_secs(60), |rows| {
        !rows_of(rows, "c0").is_empty()
    });
    assert!(!rows_of(&out, "c0").is_empty(), "the query never answered");

    produce(&input, &[payment("c1", 10)]);
    std::thread::sleep(Duration::from_millis(1500));
    produce(&input, &[payment("c1", 5)]);
    // Each event enters (sum 10, then 15) and leaves five seconds later
    // (sum 5, then null); the lifetime count keeps both.
    let out = consume_until(&output, Duration::from_secs(40), |rows| {
        rows_of(rows, "c1").len() >= 4
    });
    let within = started.elapsed();
    let c1: Vec<(serde_json::Value, serde_json::Value)> = rows_of(&out, "c1")
        .iter()
        .map(|r| (r["sum_5s"].clone(), r["n"].clone()))
        .collect();
    assert_eq!(
        c1,
        vec![
            (serde_json::json!(10), serde_json::json!(1)),
            (serde_json::json!(15), serde_json::json!(2)),
            (serde_json::json!(5), serde_json::json!(2)),
            (serde_json::Value::Null, serde_json::json!(2)),
        ],
        "{out:?}"
    );
    assert!(
        reports.lock().unwrap().is_empty() || within >= Duration::from_secs(60),
        "rows were written before the first checkpoint"
    );

    // Stopping checkpoints the open batch and reports it, with latencies.
    stop.stop();
    run.join().unwrap();
    let reports = reports.lock().unwrap();
    let last = reports.last().expect("a progress report at the checkpoint");
    let input_rows: u64 = reports.iter().map(|p| p.num_input_rows).sum();
    assert_eq!(input_rows, 3, "{}", last.json());
    assert!(last.latency_ms.contains_key("p99"), "{}", last.json());
    for (committed, end) in committed_and_end(&app, &input, 1) {
        assert_eq!(committed, end, "offsets committed at the checkpoint");
    }
}
