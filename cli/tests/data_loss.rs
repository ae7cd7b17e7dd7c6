//! Spark's `failOnDataLoss` (#44): records past the group's committed
//! offset are deleted (as retention or `kafka-delete-records` would) before
//! the next run. That run stops with an error naming the topic, partition,
//! committed and earliest offsets instead of moving on in silence; with
//! `source.fail_on_data_loss: false` it reads on from the earliest offset.

mod common;

use common::*;
use std::time::Duration;
use tidemark_integration_tests::*;

fn pipeline(app: &str, input: &str, output: &str, extra: &str) -> String {
    format!(
        r#"name: {app}
source:
  kind: kafka
  topic: {input}
  schema: {{id: string}}{extra}
trigger: available_now
sink: {{kind: kafka, topic: {output}}}
"#
    )
}

fn produce_ids(input: &str, ids: std::ops::Range<i32>) {
    let records: Vec<_> = ids
        .map(|i| {
            (
                Some(0),
                format!("k{i}"),
                format!(r#"{{"id": "{i}"}}"#).into_bytes(),
            )
        })
        .collect();
    produce_each_with(&plain(), input, &records);
}

/// Deletes the records of partition 0 of `topic` before `offset`.
fn delete_records_before(topic: &str, offset: i64) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = plain().create().unwrap();
    let mut before = rdkafka::TopicPartitionList::new();
    before
        .add_partition_offset(topic, 0, rdkafka::Offset::Offset(offset))
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let deleted = runtime
        .block_on(admin.delete_records(&before, &AdminOptions::new()))
        .unwrap();
    for e in deleted.elements() {
        assert!(e.error().is_ok(), "deleting records: {:?}", e.error());
    }
}

#[test]
fn records_deleted_past_the_committed_offset_stop_the_run_unless_asked_to_read_on() {
    let (input, output, app) = (unique("loss-in"), unique("loss-out"), unique("loss"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&app, &input, &output, "")).unwrap();
    produce_ids(&input, 0..10);
    let first = run_to_end(&file);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(consume_all(&output, 10, Duration::from_secs(10)).len(), 10);

    // Offsets 10..20 are written, then 10..15 deleted unread.
    produce_ids(&input, 10..20);
    delete_records_before(&input, 15);
    let stopped = run_to_end(&file);
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(
        !stopped.status.success(),
        "the loss passed unnoticed: {stderr}"
    );
    for named in [
        "source.fail_on_data_loss",
        input.as_str(),
        "partition 0",
        "committed offset 10",
        "earliest 15",
    ] {
        assert!(stderr.contains(named), "the error names {named}: {stderr}");
    }
    assert_eq!(
        consume_all(&output, 11, Duration::from_secs(3)).len(),
        10,
        "nothing more was written"
    );

    let extra = "\n  fail_on_data_loss: false";
    std::fs::write(&file, pipeline(&app, &input, &output, extra)).unwrap();
    let read_on = run_to_end(&file);
    assert!(
        read_on.status.success(),
        "{}",
        String::from_utf8_lossy(&read_on.stderr)
    );
    let mut ids: Vec<i64> = consume_all(&output, 15, Duration::from_secs(10))
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            v["id"].as_str().unwrap().parse().unwrap()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, (0..10).chain(15..20).collect::<Vec<_>>());
}
