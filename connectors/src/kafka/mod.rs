//! Kafka: a consumer-group source, a producer sink, a dead-letter topic and
//! topic administration, on rdkafka.

mod changelog;
mod dead_letter;
mod exactly_once;
mod sink;
mod source;
mod table_feed;

pub use changelog::{changelog_topic, read_changelog, KafkaChangelogWriter};
pub use dead_letter::KafkaDeadLetter;
pub use exactly_once::SharedTransactions;
pub use sink::{KafkaSink, KeyColumns, ValueFormat};
pub use source::{KafkaSource, KafkaSourceConfig};
pub use table_feed::KafkaTableFeed;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;
use tidemark::error::{Error, Result};

/// The broker to use when none is configured: `KAFKA_BOOTSTRAP`, else
/// `127.0.0.1:9092`.
pub fn default_bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

/// Creates `topic` with `partitions` partitions if it does not exist.
pub fn ensure_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<()> {
    ensure_topic_with_config(bootstrap, topic, partitions, 1, &[])
}

/// Creates `topic` if it does not exist, with a replication factor and
/// topic configuration (e.g. `cleanup.policy=compact`).
pub fn ensure_topic_with_config(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    replication: i32,
    config: &[(&str, &str)],
) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| Error::Source(format!("admin client for {bootstrap}: {e}")))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting a runtime for the admin client", e))?;
    let mut new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    for (k, v) in config {
        new_topic = new_topic.set(k, v);
    }
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = runtime
        .block_on(admin.create_topics([&new_topic], &options))
        .map_err(|e| Error::Source(format!("creating topic `{topic}`: {e}")))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(Error::Source(format!("creating topic `{name}`: {code}")))
            }
        }
    }
    Ok(())
}
