//! Spark's union of two Kafka streams, each with its own watermark, behind
//! a repartition: the streams' topics are keyed by transaction ids and not
//! co-partitioned (2 and 3 partitions), the grouping is by `id`, so the
//! union runs in the writer stage and the reader's watermark comes from
//! markers, each origin counted for its own stream with its own delay.

mod common;

use common::{run_to_end, tidemark_describe};
use std::collections::BTreeMap;
use std::time::Duration;
use tidemark_integration_tests::*;

const IDS: [&str; 3] = ["x", "y", "z"];

fn pipeline(app: &str, us: &str, eu: &str, output: &str) -> String {
    format!(
        r#"application_id: {app}
source:
  kind: kafka
  topic: {us}
  group: {app}
  format: json
  schema: {{event_time: long, id: string, amount: double}}
event_time: event_time
watermark: 2 minutes
multiple_watermark_policy: min
steps:
  - union:
      topic: {eu}
      name: eu
      watermark: 30 minutes
      schema: {{event_time: long, id: string, amount: double, vat: double}}
      steps:
        - filter: "amount > 0"
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 minute}}
      aggregates:
        - {{fn: count, as: n}}
        - {{fn: sum, column: amount, as: total}}
        - {{fn: sum, column: vat, as: vat}}
output_mode: append
trigger: available_now
max_records_per_batch: 50
sink: {{kind: kafka, topic: {output}, format: json}}
state_dir: state
"#
    )
}

/// (id, window start ms) → (count, amount total, vat total or none).
type Windows = BTreeMap<(String, i64), (i64, f64, Option<f64>)>;

/// Writes both streams; returns what every closed window must hold.
/// `us` is in order (a 2-minute watermark keeps it); `eu` comes up to 20
/// minutes out of order within each partition, which only its own
/// 30-minute watermark keeps: judged by the main stream's 2 minutes, its
/// older rows would be dropped as late.
fn produce_streams(us: &str, eu: &str) -> Windows {
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap() / 1000;
    let mut expected = Windows::new();
    let mut add = |id: &str, t: i64, amount: f64, vat: Option<f64>| {
        let slot = expected
            .entry((id.to_string(), t - t % 60_000))
            .or_insert((0, 0.0, None));
        slot.0 += 1;
        slot.1 += amount;
        if let Some(v) = vat {
            slot.2 = Some(slot.2.unwrap_or(0.0) + v);
        }
    };
    for p in 0..2 {
        let records: Vec<_> = (0..300i64)
            .map(|i| {
                let (id, t) = (IDS[(i as usize + p) % 3], start + 40 * 60_000 + i * 2_000);
                add(id, t, 1.0, None);
                let value = format!(r#"{{"event_time": {t}, "id": "{id}", "amount": 1.0}}"#);
                (format!("us-{p}-{i}"), value.into_bytes())
            })
            .collect();
        produce_to(us, Some(p as i32), &records);
    }
    for p in 0..3 {
        let records: Vec<_> = (0..200i64)
            .map(|i| {
                let back = if i % 2 == 1 { 20 * 60_000 } else { 0 };
                let id = IDS[(i as usize + p) % 3];
                let t = start + 20 * 60_000 + i * 3_000 - back;
                add(id, t, 10.0, Some(0.5));
                let value =
                    format!(r#"{{"event_time": {t}, "id": "{id}", "amount": 10.0, "vat": 0.5}}"#);
                (format!("eu-{p}-{i}"), value.into_bytes())
            })
            .collect();
        produce_to(eu, Some(p as i32), &records);
    }
    // Every partition of both streams moves past every window (their own
    // windows stay open), so the slower stream's watermark closes them.
    let end = start + 4 * 3_600_000;
    for (topic, partitions) in [(us, 2), (eu, 3)] {
        for p in 0..partitions {
            let value = format!(r#"{{"event_time": {end}, "id": "end", "amount": 1.0}}"#);
            produce_to(topic, Some(p), &[(format!("end-{p}"), value.into_bytes())]);
        }
    }
    expected
}

/// Counts equal, totals equal to rounding, the vat total present alike.
fn same_window(got: &(i64, f64, Option<f64>), want: &(i64, f64, Option<f64>)) -> bool {
    let half_units = |v: Option<f64>| v.map(|v| (v * 2.0).round() as i64);
    got.0 == want.0 && (got.1 - want.1).abs() < 1e-9 && half_units(got.2) == half_units(want.2)
}

#[test]
fn two_streams_not_co_partitioned_are_unioned_by_name_repartitioned_and_counted_once() {
    let (us, eu) = (unique("un-us"), unique("un-eu"));
    let (output, app) = (unique("un-out"), unique("un-app"));
    create_topic(&us, 2);
    create_topic(&eu, 3);
    create_topic(&output, 1);
    let expected = produce_streams(&us, &eu);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&app, &us, &eu, &output)).unwrap();
    let described = tidemark_describe(&file);
    assert!(
        described.contains("-op1-repartition") && described.contains("Union [eu] by name"),
        "{described}"
    );
    let done = run_to_end(&file);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let out = consume_all(&output, expected.len(), Duration::from_secs(60));
    let mut seen = Windows::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let start = tidemark::time::parse_rfc3339(v["window_start"].as_str().unwrap()).unwrap();
        let key = (v["id"].as_str().unwrap().to_string(), start / 1000);
        let row = (
            v["n"].as_i64().unwrap(),
            v["total"].as_f64().unwrap(),
            v["vat"].as_f64(),
        );
        assert!(seen.insert(key.clone(), row).is_none(), "twice: {v}");
    }
    let mismatched: Vec<_> = expected
        .iter()
        .filter(|(k, want)| seen.get(*k).is_none_or(|got| !same_window(got, want)))
        .map(|(k, want)| (k.clone(), *want, seen.get(k).copied()))
        .collect();
    assert!(
        mismatched.is_empty(),
        "{} of {} windows differ (key, expected, got): {:?}",
        mismatched.len(),
        expected.len(),
        &mismatched[..mismatched.len().min(10)]
    );
    assert_eq!(seen.len(), expected.len(), "no window beyond the input's");
}
