//! The start check of output topics (#44 item 1), against the real broker:
//! a sink, late-data or dead-letter topic that does not exist is refused
//! before the first batch when the broker will not create it on first
//! write, instead of every batch aborting on delivery until the run gives
//! up.

use tidemark_connectors::kafka::test_broker::TestKafka;
use tidemark_connectors::kafka::{
    broker_creates_topics, check_output_topic, ensure_topic, output_topic_verdict,
};
use tidemark_integration_tests::unique;

#[test]
fn a_missing_output_topic_passes_only_where_the_broker_creates_topics() {
    let kafka = TestKafka::start().unwrap();
    let cluster = kafka.connection();
    let existing = unique("output-existing");
    ensure_topic(&cluster, &existing, 1).unwrap();
    check_output_topic(&cluster, &existing, "sink.topic").unwrap();

    let missing = unique("output-missing");
    // The broker's own setting, read through the admin API (scripts/kafka.sh
    // runs one that creates topics; KAFKA_BOOTSTRAP may name another).
    let creates = broker_creates_topics(&cluster).expect("the broker's configuration is readable");
    let checked = check_output_topic(&cluster, &missing, "sink.topic");
    assert_eq!(checked.is_ok(), creates, "{checked:?}");

    // What a broker that does not create topics gets: the setting, the
    // topic and the fix.
    let refused = output_topic_verdict(&missing, "sink.topic", Some(false))
        .unwrap_err()
        .to_string();
    for part in [
        "sink.topic",
        missing.as_str(),
        "auto.create.topics.enable=false",
        "create it",
    ] {
        assert!(refused.contains(part), "{part}: {refused}");
    }
    assert!(output_topic_verdict(&missing, "sink.topic", None).is_ok());
}
