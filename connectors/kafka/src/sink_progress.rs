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
use tidemark::runtime::SourceOffsets;

/// The source's end position in the record's metadata `text`
/// ([`SourceOffsets::to_stored`]'s form, or the bare position the releases
/// before versions wrote); a newer one, or text that is not JSON, is an
/// error: a guess would replay the wrong batch or none.
fn end_of(text: &str, group: &str) -> Result<SourceOffsets> {
    if text.is_empty() {
        return Ok(SourceOffsets::Unknown);
    }
    let what = format!("the progress record of sink group `{group}`");
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::sink_failed(format!("{what} is unreadable"), e))?;
    SourceOffsets::from_stored(&value, &what)
}

/// How long reading the record may take before the start fails.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The progress record of one sink.
pub(crate) struct SinkProgress {
    consumer: BaseConsumer,
    topic: String,
    group: String,
    /// The source's position at the end of the batch being committed.
    end: SourceOffsets,
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
            end: SourceOffsets::Unknown,
        })
    }

    /// Remembers the source's end position for the next commit.
    pub(crate) fn set_end(&mut self, end: &SourceOffsets) {
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
            .map_err(|e| Error::sink_failed(format!("progress of `{}`", self.group), e))?;
        entry.set_metadata(self.end.to_stored().to_string());
        let group = self
            .consumer
            .group_metadata()
            .ok_or_else(|| Error::Sink(format!("no group metadata for `{}`", self.group)))?;
        Ok((offsets, group))
    }

    /// The last batch committed, with the source position recorded at its
    /// end.
    pub(crate) fn last_batch(&self) -> Result<Option<(u64, SourceOffsets)>> {
        let mut wanted = TopicPartitionList::new();
        wanted.add_partition(&self.topic, 0);
        let committed = self
            .consumer
            .committed_offsets(wanted, TIMEOUT)
            .map_err(|e| {
                Error::sink_failed(format!("reading the progress of `{}`", self.group), e)
            })?;
        let Some(entry) = committed.find_partition(&self.topic, 0) else {
            return Ok(None);
        };
        let Offset::Offset(next) = entry.offset() else {
            return Ok(None);
        };
        if next < 1 {
            return Ok(None);
        }
        let end = end_of(entry.metadata(), &self.group)?;
        Ok(Some((next as u64 - 1, end)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bare position the release before versions wrote reads as
    /// itself; this release's reads back; newer or unreadable is an error.
    #[test]
    fn the_end_position_of_each_encoding_reads_or_is_refused() {
        let end = SourceOffsets::sequence("logOffset", 7);
        assert_eq!(end_of(r#"{"logOffset":7}"#, "g").unwrap(), end);
        let written = end.to_stored().to_string();
        assert_eq!(end_of(&written, "g").unwrap(), end);
        assert_eq!(end_of("", "g").unwrap(), SourceOffsets::Unknown);
        // A Kafka position of a topic named `v` is a bare position.
        let topic_v = serde_json::json!({"v": {"0": 12}});
        assert_eq!(
            end_of(&topic_v.to_string(), "g").unwrap(),
            SourceOffsets::of_partitions([("v", 0, 12)])
        );
        let e = end_of(r#"{"v":2,"end":{}}"#, "g").unwrap_err();
        assert!(
            matches!(&e, Error::UnknownEncoding { found, .. } if found == "2"),
            "{e}"
        );
        assert!(end_of("not json", "g")
            .unwrap_err()
            .to_string()
            .contains("`g`"));
    }
}
