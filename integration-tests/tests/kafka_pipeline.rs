//! End-to-end tests on a real Kafka broker: pipeline files run through the
//! same path as `tidemark run`.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::progress::QueryProgress;
use tidemark::runtime::RunSummary;
use tidemark_integration_tests::*;
use tidemark_pipeline::PipelineFile;

fn run_pipeline(yaml: &str) -> (RunSummary, Vec<QueryProgress>) {
    let dir = tempfile::tempdir().unwrap();
    let file = PipelineFile::parse(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let connected = tidemark_connectors::connect(&file, dir.path()).unwrap();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink_reports = reports.clone();
    let (query, mut source, mut sink) = connected.wire(file.query_builder().unwrap());
    let query = query
        .on_progress(move |p: &QueryProgress| sink_reports.lock().unwrap().push(p.clone()))
        .build()
        .unwrap();
    let summary = query.run(source.as_mut(), sink.as_mut()).unwrap();
    let reports = reports.lock().unwrap().clone();
    (summary, reports)
}

fn order(i: usize, amount: f64, minute: usize) -> (String, Vec<u8>) {
    let key = format!("c{}", i % 10);
    let value = serde_json::json!({
        "event_time": format!("2026-01-01T10:{:02}:{:02}Z", minute % 60, i % 60),
        "id": key,
        "amount": amount,
    });
    (key, value.to_string().into_bytes())
}

fn filter_pipeline(name: &str, input: &str, output: &str, dlq: &str) -> String {
    format!(
        r#"name: {name}
source:
  kind: kafka
  topic: {input}
  group: {name}
  format: json
  schema: {{event_time: timestamp, id: string, amount: double}}
event_time: event_time
watermark: 1 minute
steps:
  - filter: "amount >= 0"
  - select: [id, amount, event_time]
trigger: available_now
max_records_per_batch: 500
sink: {{kind: kafka, topic: {output}, key: [id]}}
dead_letter: {{kind: kafka, topic: {dlq}}}
"#
    )
}

#[test]
fn four_partitions_to_output_every_record_accounted_then_resume() {
    let (input, output, dlq, group) = (
        unique("orders"),
        unique("filtered"),
        unique("dlq"),
        unique("filter-app"),
    );
    create_topic(&input, 4);
    create_topic(&output, 4);
    create_topic(&dlq, 1);
    // 1,000 orders, every 10th with a negative amount that the filter drops.
    let first: Vec<_> = (0..1000)
        .map(|i| order(i, if i % 10 == 0 { -1.0 } else { i as f64 }, i / 60))
        .collect();
    produce(&input, &first);

    let (summary, reports) = run_pipeline(&filter_pipeline(&group, &input, &output, &dlq));
    assert_eq!(summary.input_records, 1000);
    assert_eq!(summary.bad_records, 0);
    assert_eq!(summary.output_rows, 900);
    let out = consume_all(&output, 900, Duration::from_secs(30));
    assert_eq!(
        out.len(),
        900,
        "every kept record is in the output topic exactly once"
    );
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert!(v["amount"].as_f64().unwrap() >= 0.0);
        assert_eq!(r.key.as_deref(), Some(v["id"].as_str().unwrap().as_bytes()));
    }
    // Offsets are committed to the end of every partition.
    for (p, (committed, end)) in committed_and_end(&group, &input, 4).into_iter().enumerate() {
        assert_eq!(committed, end, "partition {p}");
    }
    // Progress: input rows add up, and the watermark is reported and moves.
    let total: u64 = reports.iter().map(|p| p.num_input_rows).sum();
    assert_eq!(total, 1000);
    let watermarks: Vec<&String> = reports
        .iter()
        .filter_map(|p| p.event_time.get("watermark"))
        .collect();
    assert_eq!(
        watermarks.len(),
        reports.len(),
        "every report has eventTime.watermark"
    );
    assert_eq!(
        watermarks[0], "1970-01-01T00:00:00Z",
        "the first batch runs with no watermark"
    );
    let json: serde_json::Value = serde_json::from_str(&reports[0].json()).unwrap();
    for field in [
        "id",
        "runId",
        "batchId",
        "numInputRows",
        "batchDuration",
        "durationMs",
        "eventTime",
        "stateOperators",
        "sources",
        "sink",
    ] {
        assert!(
            json.get(field).is_some(),
            "progress JSON lacks {field}: {json}"
        );
    }

    // Spark's phase names, and the source's offsets as Spark writes them
    // for Kafka: the latest at least as far as where the batch ended.
    for phase in [
        "triggerExecution",
        "latestOffset",
        "getBatch",
        "addBatch",
        "commitOffsets",
        "walCommit",
        "queryPlanning",
    ] {
        assert!(
            json["durationMs"][phase].is_u64(),
            "durationMs lacks {phase}: {json}"
        );
    }
    let last: serde_json::Value = serde_json::from_str(&reports.last().unwrap().json()).unwrap();
    let source = &last["sources"][0];
    let (end, latest) = (
        &source["endOffset"][&input],
        &source["latestOffset"][&input],
    );
    assert!(end.is_object() && latest.is_object(), "{source}");
    for (partition, end) in end.as_object().unwrap() {
        let latest = latest[partition].as_i64().unwrap_or(-1);
        assert!(latest >= end.as_i64().unwrap(), "{partition}: {source}");
    }

    // A restart resumes from the committed offsets: only the new records.
    let second: Vec<_> = (1000..1200).map(|i| order(i, 1.0, 30)).collect();
    produce(&input, &second);
    let (summary, resumed) = run_pipeline(&filter_pipeline(&group, &input, &output, &dlq));
    assert_eq!(summary.input_records, 200);
    // The watermark moved and came back with the committed offsets: the
    // resumed run's first batch already runs with it (every partition saw
    // events from 10:00 on, so it is past 1970).
    let resumed_watermark = &resumed[0].event_time["watermark"];
    assert!(
        resumed_watermark.as_str() > "2026-01-01T00:00:00Z",
        "the watermark moves and is restored: {resumed_watermark}"
    );
    let out = consume_all(&output, 1100, Duration::from_secs(30));
    assert_eq!(out.len(), 1100);
}

#[test]
fn malformed_json_and_unknown_avro_schema_go_to_the_dead_letter_topic() {
    // JSON: one malformed record among good ones.
    let (input, output, dlq, group) = (
        unique("events"),
        unique("events-out"),
        unique("events-dlq"),
        unique("dlq-app"),
    );
    create_topic(&input, 4);
    create_topic(&output, 1);
    create_topic(&dlq, 1);
    let mut records: Vec<_> = (0..50).map(|i| order(i, 1.0, 1)).collect();
    records.insert(20, ("c3".into(), b"{\"event_time\": oops".to_vec()));
    records.insert(
        30,
        (
            "c4".into(),
            br#"{"event_time": "not a time", "id": "c4", "amount": 1}"#.to_vec(),
        ),
    );
    produce(&input, &records);
    let (summary, reports) = run_pipeline(&filter_pipeline(&group, &input, &output, &dlq));
    assert_eq!(summary.input_records, 52);
    assert_eq!(summary.bad_records, 2);
    assert_eq!(
        reports
            .iter()
            .map(|p| p.sources[0].num_bad_records)
            .sum::<u64>(),
        2
    );
    assert_eq!(
        consume_all(&output, 50, Duration::from_secs(30)).len(),
        50,
        "good records flow on"
    );
    let dead = consume_all(&dlq, 2, Duration::from_secs(30));
    assert_eq!(dead.len(), 2);
    for d in &dead {
        assert_eq!(d.headers["tidemark.source.topic"], input);
        assert!(d.headers.contains_key("tidemark.source.partition"));
        assert!(d.headers.contains_key("tidemark.source.offset"));
    }
    let errors: Vec<&str> = dead
        .iter()
        .map(|d| d.headers["tidemark.error"].as_str())
        .collect();
    assert!(
        errors.iter().any(|e| e.contains("malformed JSON")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("`event_time`") && e.contains("RFC 3339")),
        "{errors:?}"
    );

    // Avro: a record whose schema id nobody knows.
    let dir = tempfile::tempdir().unwrap();
    let schema_text = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"string"},{"name":"amount","type":"double"},
        {"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;
    let schema_path = dir.path().join("order.avsc");
    std::fs::write(&schema_path, schema_text).unwrap();
    let schema = apache_avro::Schema::parse_str(schema_text).unwrap();
    let encoder = tidemark_connectors::avro::AvroEncoder::new(schema, 1).unwrap();
    let (avro_in, avro_out, avro_dlq, avro_group) = (
        unique("avro-in"),
        unique("avro-out"),
        unique("avro-dlq"),
        unique("avro-app"),
    );
    create_topic(&avro_in, 2);
    create_topic(&avro_out, 1);
    create_topic(&avro_dlq, 1);
    let mut avro_records = Vec::new();
    for i in 0..20i64 {
        let row: tidemark::row::Row = [
            ("id", tidemark::row::Value::from(format!("c{i}").as_str())),
            ("amount", tidemark::row::Value::Double(i as f64)),
            (
                "event_time",
                tidemark::row::Value::Timestamp(1_767_261_600_000_000 + i * 1_000_000),
            ),
        ]
        .into_iter()
        .collect();
        avro_records.push((format!("c{i}"), encoder.encode(&row).unwrap()));
    }
    let mut unknown = avro_records[0].1.clone();
    unknown[1..5].copy_from_slice(&99u32.to_be_bytes());
    avro_records.insert(7, ("c99".into(), unknown));
    produce(&avro_in, &avro_records);
    let yaml = format!(
        r#"name: {avro_group}
source:
  kind: kafka
  topic: {avro_in}
  format: avro
  avro_schemas: {{1: {}}}
event_time: event_time
watermark: 1 minute
trigger: available_now
sink: {{kind: kafka, topic: {avro_out}}}
dead_letter: {{kind: kafka, topic: {avro_dlq}}}
"#,
        schema_path.display()
    );
    let (summary, _) = run_pipeline(&yaml);
    assert_eq!(
        (
            summary.input_records,
            summary.bad_records,
            summary.output_rows
        ),
        (21, 1, 20)
    );
    let dead = consume_all(&avro_dlq, 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].headers["tidemark.error"].contains("unknown schema id 99"),
        "{:?}",
        dead[0].headers
    );
    let out = consume_all(&avro_out, 20, Duration::from_secs(30));
    let v: serde_json::Value = serde_json::from_slice(out[0].value.as_deref().unwrap()).unwrap();
    assert!(
        v["event_time"]
            .as_str()
            .unwrap()
            .starts_with("2026-01-01T10:"),
        "{v}"
    );
}

#[test]
fn windowed_counts_over_a_real_broker() {
    let (input, output, dlq, group) = (
        unique("clicks"),
        unique("clicks-per-5m"),
        unique("clicks-dlq"),
        unique("window-app"),
    );
    create_topic(&input, 4);
    create_topic(&output, 1);
    // 10 keys x 30 minutes, one order per key per minute; keyed by id so each
    // key's windows live in one task.
    let records: Vec<_> = (0..300).map(|i| order(i, 1.0, i / 10)).collect();
    produce(&input, &records);
    let yaml = format!(
        r#"name: {group}
source: {{kind: kafka, topic: {input}, schema: {{event_time: timestamp, id: string, amount: double}}}}
event_time: event_time
watermark: 1 minute
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 5 minutes}}
      aggregates: [{{fn: count, as: n}}, {{fn: sum, column: amount}}]
output_mode: append
trigger: available_now
sink: {{kind: kafka, topic: {output}, key: [id]}}
dead_letter: {{kind: kafka, topic: {dlq}}}
"#
    );
    let (summary, _) = run_pipeline(&yaml);
    assert_eq!(summary.input_records, 300);
    // Windows close when the watermark (max event time - 1 minute) passes
    // their end: 10:00-10:25 close (5 windows x 10 keys); 10:25-10:30 stays open.
    let out = consume_all(&output, 50, Duration::from_secs(30));
    assert_eq!(out.len(), 50);
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(v["n"], 5, "{v}");
        assert_eq!(v["sum(amount)"], 5.0, "{v}");
    }
}
