//! `dedup: {keys: [guid], within_watermark: true}` over a real broker under
//! `exactly_once`, killed with SIGKILL twice mid-stream and restarted: the
//! output topic, read `read_committed`, holds each guid once, and it is the
//! guid's first occurrence.

mod common;

use common::{run_and_kill, run_to_end};
use std::time::Duration;
use tidemark_integration_tests::*;

const GUIDS: i64 = 600;

fn pipeline(app: &str, input: &str, output: &str, trigger: &str) -> String {
    format!(
        r#"name: {app}
source:
  kind: kafka
  topic: {input}
  keyed_by: [guid]
  schema: {{ts: timestamp, guid: string, seq: long}}
  properties: {{session.timeout.ms: "6000", heartbeat.interval.ms: "1000"}}
event_time: ts
watermark: 1 hour
steps:
  - dedup: {{keys: [guid], within_watermark: true}}
output_mode: append
trigger: {trigger}
max_records_per_batch: 100
sink: {{kind: kafka, topic: {output}, key: [guid]}}
state: {{dir: state, changelog: true, memory_mb: 32}}
processing_guarantee: exactly_once
"#
    )
}

#[test]
fn sigkill_twice_under_exactly_once_then_each_guid_is_written_once() {
    let (input, output, app) = (unique("dedup-in"), unique("dedup-out"), unique("dedup-app"));
    create_topic(&input, 4);
    create_topic(&output, 1);
    // One record a second for 40 minutes; guid g<t % 600>: each guid four
    // times, 10 minutes apart, all inside the 1-hour watermark.
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    let records: Vec<_> = (0..4 * GUIDS)
        .map(|t| {
            let guid = format!("g{}", t % GUIDS);
            let ts = tidemark::time::format_rfc3339(start + t * 1_000_000);
            let value = format!(r#"{{"ts": "{ts}", "guid": "{guid}", "seq": {t}}}"#);
            (guid, value.into_bytes())
        })
        .collect();
    produce(&input, &records);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let write = |trigger: &str| {
        std::fs::write(&file, pipeline(&app, &input, &output, trigger)).unwrap();
    };
    write("{micro_batch: 200 milliseconds}");
    run_and_kill(&file, 4);
    run_and_kill(&file, 6);
    write("available_now");
    let done = run_to_end(&file);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );

    let out = consume_all(&output, GUIDS as usize, Duration::from_secs(60));
    let mut seen = std::collections::BTreeMap::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let guid = v["guid"].as_str().unwrap().to_string();
        let seq = v["seq"].as_i64().unwrap();
        assert!(
            seen.insert(guid.clone(), seq).is_none(),
            "{guid} written twice"
        );
        let first = guid[1..].parse::<i64>().unwrap();
        assert_eq!(seq, first, "{guid}: the first occurrence wins");
    }
    assert_eq!(seen.len(), GUIDS as usize);
}
