//! A batch that can never commit ends the run (#44): an output record over
//! the output topic's `max.message.bytes` is refused by the broker on every
//! replay. Before, an exactly-once query aborted and replayed that batch
//! for ever inside one run; now the run exits by itself, naming the topic,
//! the partition and the broker's reason.

mod common;

use common::*;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

#[test]
fn an_output_record_over_the_topics_size_limit_ends_the_run_naming_it() {
    let (input, output, app) = (unique("big-in"), unique("big-out"), unique("big"));
    create_topic(&input, 1);
    tidemark_connectors::kafka::ensure_topic_with_config(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        &output,
        1,
        1,
        &[("max.message.bytes", "2000")],
    )
    .unwrap();
    let big = "x".repeat(5000);
    let records: Vec<_> = ["small", big.as_str(), "small too"]
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let value = format!(r#"{{"id": "{i}", "text": "{text}"}}"#);
            (Some(0), format!("k{i}"), value.into_bytes())
        })
        .collect();
    produce_each_with(&plain(), &input, &records);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        format!(
            r#"name: {app}
source:
  kind: kafka
  topic: {input}
  schema: {{id: string, text: string}}
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}}}
processing_guarantee: exactly_once
"#
        ),
    )
    .unwrap();
    let log = dir.path().join("tidemark.log");
    let mut app = tidemark_run(
        &file,
        None,
        std::process::Stdio::from(std::fs::File::create(&log).unwrap()),
    )
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = app.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = app.kill();
            let _ = app.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stderr = std::fs::read_to_string(&log).unwrap();
    let tail = &stderr[stderr.len().saturating_sub(3000)..];
    let status = status.unwrap_or_else(|| panic!("still retrying after 2 minutes:\n{tail}"));
    assert!(!status.success(), "{tail}");
    for named in [
        format!("cannot deliver to `{output}` partition 0"),
        "MessageSizeTooLarge".to_string(),
    ] {
        assert!(stderr.contains(&named), "the error names {named}:\n{tail}");
    }
    assert!(
        consume_all(&output, 1, Duration::from_secs(3)).is_empty(),
        "nothing of the batch became visible"
    );
}
