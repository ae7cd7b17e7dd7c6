//! A Kafka sink's own record of the batches it committed, for a source
//! that cannot commit its position inside the Kafka transaction (the files
//! source): each batch's transaction also commits, for a consumer group of
//! the sink's own, the offset `batch id + 1` of the output topic's
//! partition 0, with the source's end position as its metadata. The
//! record becomes visible with the batch's records or not at all, so after
//! a crash between the transaction's commit and the source's own record the
//! query knows the batch is out (Delta's `txn` plays the same part) and
//! replays it without writing it again.

use crate::connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;
use tidemark::error::{Error, Result};

/// How long reading the record may take before the start fails.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The progress record of one sink.
pub(crate) struct SinkProgress {
    consumer: BaseConsumer,
    topic: String,
    group: String,
    /// The source's position at the end of the batch being committed.
    end: serde_json::Value,
}

impl SinkProgress {
    /// The record of `group` on `topic` (the sink's output topic) at
    /// `cluster`.
    pub(crate) fn new(cluster: &KafkaConnection, topic: &str, group: &str) -> Result<Self> {
        let mut config = cluster.client_config(&[]);
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            // Offsets committed by a transaction still open are not read.
            .set("isolation.level", "read_committed");
        let consumer: BaseConsumer = cluster.create_plain(&config, "sink progress consumer")?;
        Ok(SinkProgress {
            consumer,
            topic: topic.to_string(),
            group: group.to_string(),
            end: serde_json::Value::Null,
        })
    }

    /// Remembers the source's end position for the next commit.
    pub(crate) fn set_end(&mut self, end: &serde_json::Value) {
        self.end = end.clone();
    }

    /// What batch `batch_id`'s transaction commits as the record, and the
    /// group metadata to commit it with.
    pub(crate) fn offsets_for(
        &self,
        batch_id: u64,
    ) -> Result<(TopicPartitionList, rdkafka::consumer::ConsumerGroupMetadata)> {
        let mut offsets = TopicPartitionList::new();
        let mut entry = offsets.add_partition(&self.topic, 0);
        entry
            .set_offset(Offset::Offset(batch_id as i64 + 1))
            .map_err(|e| Error::Sink(format!("progress of `{}`: {e}", self.group)))?;
        entry.set_metadata(self.end.to_string());
        let group = self
            .consumer
            .group_metadata()
            .ok_or_else(|| Error::Sink(format!("no group metadata for `{}`", self.group)))?;
        Ok((offsets, group))
    }

    /// The last batch committed, with the source position recorded at its
    /// end.
    pub(crate) fn last_batch(&self) -> Result<Option<(u64, serde_json::Value)>> {
        let mut wanted = TopicPartitionList::new();
        wanted.add_partition(&self.topic, 0);
        let committed = self
            .consumer
            .committed_offsets(wanted, TIMEOUT)
            .map_err(|e| Error::Sink(format!("reading the progress of `{}`: {e}", self.group)))?;
        let Some(entry) = committed.find_partition(&self.topic, 0) else {
            return Ok(None);
        };
        let Offset::Offset(next) = entry.offset() else {
            return Ok(None);
        };
        if next < 1 {
            return Ok(None);
        }
        let end = serde_json::from_str(entry.metadata()).unwrap_or(serde_json::Value::Null);
        Ok(Some((next as u64 - 1, end)))
    }
}
