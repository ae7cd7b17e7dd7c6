//! What `tidemark reset` does on the cluster (Kafka Streams' application
//! reset tool): a group's committed offsets moved to the start of its
//! input or to a time, groups and internal topics deleted. Every step
//! refuses a group that still has members: offsets committed under a
//! running instance would be overwritten by its next commit.

use crate::connection::KafkaConnection;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;
use tidemark::error::{Error, Result};

/// How long one request to the cluster may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a reset moves a group's committed offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    /// Each partition's earliest offset still held.
    Earliest,
    /// Each partition's first offset whose record's timestamp is at or
    /// after this time (epoch milliseconds); its end when none is.
    Time(i64),
}

/// Fails when `group` has members: its instances must be stopped first.
pub fn ensure_group_empty(cluster: &KafkaConnection, group: &str) -> Result<()> {
    let client: BaseConsumer = cluster.create_plain(&cluster.client_config(&[]), "reset client")?;
    let list = client
        .fetch_group_list(Some(group), REQUEST_TIMEOUT)
        .map_err(|e| Error::source_failed(format!("describing group `{group}`"), e))?;
    let members = list
        .groups()
        .iter()
        .find(|g| g.name() == group)
        .map_or(0, |g| g.members().len());
    if members > 0 {
        return Err(Error::config(
            "application_id",
            format!("group `{group}` has {members} active member(s): stop every instance of the pipeline before resetting it"),
        ));
    }
    Ok(())
}

/// Commits `group`'s offsets on every partition of `topics` to `to`;
/// returns `(topic, partition, offset)` as committed.
pub fn reset_offsets(
    cluster: &KafkaConnection,
    group: &str,
    topics: &[String],
    to: ResetTo,
) -> Result<Vec<(String, i32, i64)>> {
    let mut config = cluster.client_config(&[]);
    config.set("group.id", group);
    config.set("enable.auto.commit", "false");
    let consumer: BaseConsumer = cluster.create_plain(&config, "reset client")?;
    let positions = target_offsets(&consumer, topics, to)?;
    let mut list = TopicPartitionList::new();
    for (topic, partition, offset) in &positions {
        list.add_partition_offset(topic, *partition, Offset::Offset(*offset))
            .map_err(|e| Error::source_failed(format!("offset of `{topic}` [{partition}]"), e))?;
    }
    consumer
        .commit(&list, CommitMode::Sync)
        .map_err(|e| Error::source_failed(format!("committing group `{group}`'s offsets"), e))?;
    Ok(positions)
}

/// Where each partition of `topics` goes.
fn target_offsets(
    consumer: &BaseConsumer,
    topics: &[String],
    to: ResetTo,
) -> Result<Vec<(String, i32, i64)>> {
    let mut positions = Vec::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
            .map_err(|e| Error::source_failed(format!("metadata of `{topic}`"), e))?;
        let partitions = metadata
            .topics()
            .first()
            .filter(|t| t.error().is_none())
            .map(|t| t.partitions().len() as i32)
            .ok_or_else(|| Error::Source(format!("topic `{topic}` does not exist")))?;
        for partition in 0..partitions {
            let (low, high) = consumer
                .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
                .map_err(|e| {
                    Error::source_failed(format!("offsets of `{topic}` [{partition}]"), e)
                })?;
            let offset = match to {
                ResetTo::Earliest => low,
                ResetTo::Time(ms) => {
                    offset_at_time(consumer, topic, partition, ms)?.unwrap_or(high)
                }
            };
            positions.push((topic.clone(), partition, offset));
        }
    }
    Ok(positions)
}

/// The first offset of `topic` [`partition`] at or after `ms`, if any.
fn offset_at_time(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    ms: i64,
) -> Result<Option<i64>> {
    let mut query = TopicPartitionList::new();
    query
        .add_partition_offset(topic, partition, Offset::Offset(ms))
        .map_err(|e| Error::source_failed(format!("offset of `{topic}` [{partition}]"), e))?;
    let found = consumer
        .offsets_for_times(query, REQUEST_TIMEOUT)
        .map_err(|e| {
            Error::source_failed(format!("offsets of `{topic}` [{partition}] by time"), e)
        })?;
    Ok(found
        .find_partition(topic, partition)
        .and_then(|p| match p.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        }))
}

/// The metadata `group` committed with its offsets on `topics` (the task
/// checkpoints), one per partition that has any.
pub fn committed_metadata(
    cluster: &KafkaConnection,
    group: &str,
    topics: &[String],
) -> Result<Vec<String>> {
    let mut config = cluster.client_config(&[]);
    config.set("group.id", group);
    config.set("enable.auto.commit", "false");
    let consumer: BaseConsumer = cluster.create_plain(&config, "reset client")?;
    let metadata = consumer
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .map_err(|e| Error::source_failed("listing topics", e))?;
    let mut list = TopicPartitionList::new();
    for topic in metadata.topics() {
        if topics.iter().any(|t| t == topic.name()) {
            for partition in topic.partitions() {
                list.add_partition(topic.name(), partition.id());
            }
        }
    }
    if list.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = consumer
        .committed_offsets(list, REQUEST_TIMEOUT)
        .map_err(|e| Error::source_failed(format!("reading group `{group}`'s offsets"), e))?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| e.metadata().to_string())
        .filter(|m| !m.is_empty())
        .collect())
}

/// Those of `candidates` that exist on the cluster.
pub fn existing_topics(cluster: &KafkaConnection, candidates: &[String]) -> Result<Vec<String>> {
    let client: BaseConsumer = cluster.create_plain(&cluster.client_config(&[]), "reset client")?;
    let metadata = client
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .map_err(|e| Error::source_failed("listing topics", e))?;
    let mut topics: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|name| candidates.contains(name))
        .collect();
    topics.sort();
    Ok(topics)
}

/// Deletes `topics` (one already gone is not an error).
pub fn delete_topics(cluster: &KafkaConnection, topics: &[String]) -> Result<()> {
    if topics.is_empty() {
        return Ok(());
    }
    let (admin, runtime) = admin(cluster)?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let results = runtime
        .block_on(admin.delete_topics(&names, &options))
        .map_err(|e| Error::source_failed("deleting topics", e))?;
    each_deleted(results, RDKafkaErrorCode::UnknownTopicOrPartition, "topic")
}

/// Deletes `groups` with their committed offsets (one not there is not an
/// error).
pub fn delete_groups(cluster: &KafkaConnection, groups: &[String]) -> Result<()> {
    if groups.is_empty() {
        return Ok(());
    }
    let (admin, runtime) = admin(cluster)?;
    let names: Vec<&str> = groups.iter().map(String::as_str).collect();
    let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let results = runtime
        .block_on(admin.delete_groups(&names, &options))
        .map_err(|e| Error::source_failed("deleting groups", e))?;
    each_deleted(results, RDKafkaErrorCode::GroupIdNotFound, "group")
}

/// Fails on the first deletion that failed for another reason than
/// `absent` (the `what` was not there).
fn each_deleted(
    results: Vec<std::result::Result<String, (String, RDKafkaErrorCode)>>,
    absent: RDKafkaErrorCode,
    what: &str,
) -> Result<()> {
    for result in results {
        match result {
            Ok(_) => {}
            Err((_, code)) if code == absent => {}
            Err((name, code)) => {
                return Err(Error::source_failed(
                    format!("deleting {what} `{name}`"),
                    code,
                ))
            }
        }
    }
    Ok(())
}

fn admin(
    cluster: &KafkaConnection,
) -> Result<(AdminClient<DefaultClientContext>, tokio::runtime::Runtime)> {
    let admin = cluster.create_plain(&cluster.client_config(&[]), "admin client")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting a runtime for the admin client", e))?;
    Ok((admin, runtime))
}
