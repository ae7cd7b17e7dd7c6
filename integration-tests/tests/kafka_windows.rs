//! Seed 003's mining-machine query on a real broker: 10-minute windows, the
//! average temperature and pressure per machine, a 10-minute watermark,
//! append mode; then a restart that resumes with the watermark stored in the
//! committed offsets' metadata.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::progress::QueryProgress;
use tidemark_integration_tests::*;
use tidemark_pipeline::PipelineFile;

fn reading(minute: i64, machine: &str, temperature: f64, pressure: f64) -> (String, Vec<u8>) {
    let t = tidemark::time::parse_rfc3339("2026-01-01T10:50:00Z").unwrap() + minute * 60_000_000;
    let value = serde_json::json!({
        "eventTimestamp": tidemark::time::format_rfc3339(t),
        "machine": machine,
        "temperature": temperature,
        "pressure": pressure,
    });
    (machine.to_string(), value.to_string().into_bytes())
}

fn run(yaml: &str) -> Vec<QueryProgress> {
    run_in(tempfile::tempdir().unwrap().path(), yaml)
}

#[test]
fn mining_machines_average_per_ten_minutes_and_resume_with_the_watermark() {
    let (input, output, group) = (
        unique("sensors"),
        unique("machine-health"),
        unique("mining"),
    );
    create_topic(&input, 2);
    create_topic(&output, 1);
    // 35 readings per machine, one a minute from 10:50 to 11:24; machine m1
    // on partition 0, m2 on partition 1. m1's temperature alternates 20/21
    // and its pressure cycles 1.0, 1.25, 1.5, 1.75, 2.0; m2's temperature
    // alternates 30/32 at a constant pressure of 2.0. Every 10-minute window
    // therefore averages to m1 (20.5, 1.5) and m2 (31.0, 2.0).
    let m1: Vec<_> = (0..35)
        .map(|i| reading(i, "m1", 20.0 + (i % 2) as f64, 1.0 + (i % 5) as f64 * 0.25))
        .collect();
    let m2: Vec<_> = (0..35)
        .map(|i| reading(i, "m2", 30.0 + 2.0 * (i % 2) as f64, 2.0))
        .collect();
    produce_to(&input, Some(0), &m1);
    produce_to(&input, Some(1), &m2);
    let yaml = format!(
        r#"name: {group}
source:
  kind: kafka
  topic: {input}
  schema: {{eventTimestamp: timestamp, machine: string, temperature: double, pressure: double}}
event_time: eventTimestamp
watermark: 10 minutes
steps:
  - window_aggregate:
      keys: [machine]
      window: {{tumbling: 10 minutes}}
      aggregates:
        - {{fn: avg, column: temperature, as: avg_temperature}}
        - {{fn: avg, column: pressure, as: avg_pressure}}
        - {{fn: count, as: readings}}
output_mode: append
trigger: available_now
sink: {{kind: kafka, topic: {output}, key: [machine]}}
"#
    );
    let reports = run(&yaml);
    // The last reading is 11:24, so the watermark reaches 11:14: the windows
    // ending 11:00 and 11:10 close; 11:10-11:20 and 11:20-11:30 stay open.
    let out = consume_all(&output, 4, Duration::from_secs(30));
    let mut rows: Vec<serde_json::Value> = out
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
        .collect();
    rows.sort_by_key(|r| (r["machine"].to_string(), r["window_start"].to_string()));
    let expected = [
        (
            "m1",
            "2026-01-01T10:50:00Z",
            "2026-01-01T11:00:00Z",
            20.5,
            1.5,
        ),
        (
            "m1",
            "2026-01-01T11:00:00Z",
            "2026-01-01T11:10:00Z",
            20.5,
            1.5,
        ),
        (
            "m2",
            "2026-01-01T10:50:00Z",
            "2026-01-01T11:00:00Z",
            31.0,
            2.0,
        ),
        (
            "m2",
            "2026-01-01T11:00:00Z",
            "2026-01-01T11:10:00Z",
            31.0,
            2.0,
        ),
    ];
    assert_eq!(rows.len(), expected.len(), "{rows:?}");
    for (row, (machine, start, end, temperature, pressure)) in rows.iter().zip(expected) {
        assert_eq!(row["machine"], machine);
        assert_eq!(row["window_start"], start);
        assert_eq!(row["window_end"], end);
        assert_eq!(row["readings"], 10);
        assert!(
            (row["avg_temperature"].as_f64().unwrap() - temperature).abs() < 1e-9,
            "{row}"
        );
        assert!(
            (row["avg_pressure"].as_f64().unwrap() - pressure).abs() < 1e-9,
            "{row}"
        );
    }
    let last = reports.last().unwrap();
    assert_eq!(
        last.event_time["watermark"],
        "2026-01-01T11:14:00Z",
        "{}",
        last.json()
    );

    // Restart: a reading for 10:55 arrives. The watermark committed with the
    // offsets (11:14) comes back, so the row is late for its window (ends
    // 11:00) and is dropped and counted, not added to a window that was
    // already written.
    produce_to(&input, Some(0), &[reading(5, "m1", 99.0, 9.0)]);
    let reports = run(&yaml);
    let dropped: u64 = reports
        .iter()
        .flat_map(|p| &p.state_operators)
        .map(|s| s.num_rows_dropped_by_watermark)
        .sum();
    assert_eq!(
        dropped,
        1,
        "{:?}",
        reports.iter().map(|p| p.json()).collect::<Vec<_>>()
    );
    assert_eq!(reports[0].event_time["watermark"], "2026-01-01T11:14:00Z");
    assert_eq!(
        consume_all(&output, 4, Duration::from_secs(5)).len(),
        4,
        "nothing new written"
    );
}

fn run_in(dir: &std::path::Path, yaml: &str) -> Vec<QueryProgress> {
    let file = PipelineFile::parse(yaml).unwrap();
    let connected = tidemark_connectors::connect(&file, dir).unwrap();
    let (query, mut source, mut sink) = connected.wire(file.query_builder().unwrap());
    let reports = Arc::new(Mutex::new(Vec::new()));
    let seen = reports.clone();
    query
        .on_progress(move |p: &QueryProgress| seen.lock().unwrap().push(p.clone()))
        .build()
        .unwrap()
        .run(source.as_mut(), sink.as_mut())
        .unwrap();
    let reports = reports.lock().unwrap().clone();
    reports
}

#[test]
fn open_windows_survive_a_restart_and_a_lost_state_directory_through_the_changelog() {
    let (input, output, group) = (unique("readings"), unique("averages"), unique("durable"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"name: {group}
source:
  kind: kafka
  topic: {input}
  schema: {{eventTimestamp: timestamp, machine: string, temperature: double, pressure: double}}
event_time: eventTimestamp
watermark: 10 minutes
steps:
  - window_aggregate:
      keys: [machine]
      window: {{tumbling: 10 minutes}}
      aggregates: [{{fn: count, as: readings}}, {{fn: avg, column: temperature, as: avg_temperature}}]
output_mode: append
trigger: available_now
sink: {{kind: kafka, topic: {output}, key: [machine]}}
state: {{dir: state, changelog: true, memory_mb: 64}}
"#
    );
    // Run 1: 10:50-10:58, nine readings; the 10:50-11:00 window stays open.
    let first: Vec<_> = (0..9).map(|i| reading(i, "m1", 20.0, 1.0)).collect();
    produce_to(&input, Some(0), &first);
    run_in(dir.path(), &yaml);
    assert_eq!(consume_all(&output, 0, Duration::from_secs(2)).len(), 0);

    // The local state directory is lost between runs.
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();

    // Run 2: 10:59 and 11:15; the watermark passes 11:00 and the window
    // closes with all ten readings, nine of them restored from the changelog.
    let second = vec![reading(9, "m1", 30.0, 1.0), reading(25, "m1", 50.0, 1.0)];
    produce_to(&input, Some(0), &second);
    run_in(dir.path(), &yaml);
    let out = consume_all(&output, 1, Duration::from_secs(30));
    assert_eq!(out.len(), 1);
    let row: serde_json::Value = serde_json::from_slice(out[0].value.as_deref().unwrap()).unwrap();
    assert_eq!(row["window_start"], "2026-01-01T10:50:00Z");
    assert_eq!(row["readings"], 10, "{row}");
    assert!(
        (row["avg_temperature"].as_f64().unwrap() - 21.0).abs() < 1e-9,
        "{row}"
    );
}
