//! Topic administration and metadata: creating topics, reading
//! partition counts.

use crate::connection::KafkaConnection;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;
use tidemark::error::{Error, Result};

/// Creates `topic` with `partitions` partitions if it does not exist.
pub fn ensure_topic(cluster: &KafkaConnection, topic: &str, partitions: i32) -> Result<()> {
    ensure_topic_with_config(cluster, topic, partitions, 1, &[])
}

/// Creates `topic` if it does not exist, with a replication factor and
/// topic configuration (e.g. `cleanup.policy=compact`).
pub fn ensure_topic_with_config(
    cluster: &KafkaConnection,
    topic: &str,
    partitions: i32,
    replication: i32,
    config: &[(&str, &str)],
) -> Result<()> {
    if topic_exists(cluster, topic) {
        // No admin request: a cluster may refuse this client the right to
        // create topics, and librdkafka's mock cluster does not answer one.
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> =
        cluster.create_plain(&cluster.client_config(&[]), "admin client")?;
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
        .map_err(|e| Error::source_failed(format!("creating topic `{topic}`"), e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(Error::source_failed(
                    format!("creating topic `{name}`"),
                    code,
                ))
            }
        }
    }
    Ok(())
}

/// Checks, before the first batch, that output can reach `topic` (the
/// setting `key` names it): the topic exists, or the broker creates topics
/// on first write (`auto.create.topics.enable`). Otherwise every batch
/// would abort on delivery until the run gave up; this refuses it at start
/// with the topic and the fix. A broker that will not say (no right to
/// describe its configuration, librdkafka's mock cluster) is given the
/// benefit of the doubt, with a warning.
pub fn check_output_topic(cluster: &KafkaConnection, topic: &str, key: &str) -> Result<()> {
    if topic_exists(cluster, topic) {
        return Ok(());
    }
    output_topic_verdict(topic, key, broker_creates_topics(cluster))
}

/// [`check_output_topic`]'s answer for a topic that does not exist, given
/// whether the broker creates topics on first write (`None`: unknown).
pub fn output_topic_verdict(topic: &str, key: &str, auto_create: Option<bool>) -> Result<()> {
    match auto_create {
        Some(true) => {
            tracing::info!(topic, "the output topic does not exist yet: the broker creates it on first write");
            Ok(())
        }
        Some(false) => Err(Error::config(
            key,
            format!(
                "topic `{topic}` does not exist and the broker does not create topics on first write (auto.create.topics.enable=false): create it, or name an existing topic"
            ),
        )),
        None => {
            tracing::warn!(topic, "the output topic does not exist and the broker did not say whether it creates topics: the first write will tell");
            Ok(())
        }
    }
}

/// The broker's `auto.create.topics.enable`, or `None` when it cannot be
/// read within a few seconds.
pub fn broker_creates_topics(cluster: &KafkaConnection) -> Option<bool> {
    use rdkafka::admin::ResourceSpecifier;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer = cluster
        .create_plain::<BaseConsumer>(&cluster.client_config(&[]), "metadata client")
        .ok()?;
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .ok()?;
    let broker = metadata.brokers().first()?.id();
    drop(consumer);
    let admin: AdminClient<DefaultClientContext> = cluster
        .create_plain(&cluster.client_config(&[]), "admin client")
        .ok()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
    let results = runtime
        .block_on(admin.describe_configs([&ResourceSpecifier::Broker(broker)], &options))
        .ok()?;
    let config = results.into_iter().next()?.ok()?;
    let value = config.get("auto.create.topics.enable")?.value.clone()?;
    Some(value.eq_ignore_ascii_case("true"))
}

/// Whether the cluster's metadata lists `topic` with partitions (a lookup
/// that fails says no: creating the topic then tells why).
fn topic_exists(cluster: &KafkaConnection, topic: &str) -> bool {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let Ok(consumer) =
        cluster.create_plain::<BaseConsumer>(&cluster.client_config(&[]), "metadata client")
    else {
        return false;
    };
    consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .is_ok_and(|metadata| {
            metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        })
}

/// The partition count of `topic`.
pub fn partition_count(cluster: &KafkaConnection, topic: &str) -> Result<i32> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer =
        cluster.create_plain(&cluster.client_config(&[]), "metadata client")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), std::time::Duration::from_secs(10))
        .map_err(|e| Error::source_failed(format!("metadata of `{topic}`"), e))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| t.partitions().len() as i32)
        .max()
        .unwrap_or(1)
        .max(1))
}

/// A client whose end-offset queries (`fetch_watermarks`) give the high
/// watermark, every record written, committed or not, with `properties`
/// (the reading client's own, for its security settings).
///
/// Not the last stable offset a `read_committed` client is told: right
/// after a transaction commits, and until its commit markers are written
/// (asynchronously, by the transaction coordinator), the last stable offset
/// still stands before that transaction's records. A reader that took it as
/// the end would stop short of a batch that did commit: a restore would
/// miss its state (under offsets already past its input), an
/// available-now run its rows. Reading with `read_committed` up to the high
/// watermark waits for the markers instead (and for an open transaction of
/// a dead writer to be aborted).
pub fn high_watermark_client(cluster: &KafkaConnection) -> Result<rdkafka::consumer::BaseConsumer> {
    let mut config = cluster.client_config(&[]);
    config.set("isolation.level", "read_uncommitted");
    cluster.create_plain(&config, "end-offset client")
}
