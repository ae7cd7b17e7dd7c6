//! The query-wide watermark's exchange on Kafka: one compacted topic per
//! application, `<application_id>-watermarks`, one record per input
//! partition (key `topic/partition`, value its largest committed event time
//! in microseconds, header [`READ_UNTIL_HEADER`] the largest record
//! timestamp read from it in milliseconds), written by whichever instance
//! holds the partition and read whole by every instance. The value stays
//! the event time alone, so an earlier version reading the topic (a rolling
//! upgrade) still counts it; a record without the header counts at once.

use crate::connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::runtime::retry::{RepeatedWarning, WARNING_INTERVAL};
use tidemark::runtime::{PartitionProgress, WatermarkExchange};

/// Shares input partitions' progress between the instances of a query
/// through the compacted topic `topic` (see the module's documentation).
pub struct KafkaWatermarkExchange {
    producer: ThreadedProducer<DefaultProducerContext>,
    consumer: BaseConsumer,
    topic: String,
    /// The consumer's errors while the cluster is unreachable, logged once
    /// per interval.
    read_warning: RepeatedWarning,
}

/// The header that carries how far the partition was read (decimal
/// milliseconds of record timestamp).
pub const READ_UNTIL_HEADER: &str = "tidemark-read-until-ms";

/// How long a publish may wait for the broker's acknowledgement.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

impl KafkaWatermarkExchange {
    /// The exchange on `topic` (created compacted, one partition, if
    /// missing) of `cluster`.
    pub fn new(cluster: &KafkaConnection, topic: &str) -> Result<Self> {
        // Replication -1: the broker's default (a managed cluster refuses 1).
        crate::ensure_topic_with_config(cluster, topic, 1, -1, &[("cleanup.policy", "compact")])?;
        let producer = cluster.create_plain(
            &cluster.client_config(&[("linger.ms", "0")]),
            "watermark exchange producer",
        )?;
        let mut config = cluster.client_config(&[
            ("fetch.queue.backoff.ms", crate::FETCH_QUEUE_BACKOFF_MS),
            ("fetch.wait.max.ms", "50"),
        ]);
        config
            .set("group.id", format!("tidemark-watermarks-{topic}"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let consumer: BaseConsumer =
            cluster.create_plain(&config, "watermark exchange consumer")?;
        let mut partitions = TopicPartitionList::new();
        partitions
            .add_partition_offset(topic, 0, Offset::Beginning)
            .map_err(|e| Error::source_failed("an offset list", e))?;
        consumer
            .assign(&partitions)
            .map_err(|e| Error::source_failed(format!("assigning `{topic}`"), e))?;
        Ok(KafkaWatermarkExchange {
            producer,
            consumer,
            topic: topic.to_string(),
            read_warning: RepeatedWarning::new(WARNING_INTERVAL),
        })
    }
}

impl WatermarkExchange for KafkaWatermarkExchange {
    fn publish(&mut self, progress: &BTreeMap<String, PartitionProgress>) -> Result<()> {
        for (input, progress) in progress {
            let value = progress.max_event_time.to_string();
            let read_until = progress.read_until_ms.map(|ms| ms.to_string());
            let mut record = BaseRecord::to(&self.topic).key(input).payload(&value);
            if let Some(ms) = &read_until {
                record = record.headers(OwnedHeaders::new().insert(Header {
                    key: READ_UNTIL_HEADER,
                    value: Some(ms),
                }));
            }
            self.producer.send(record).map_err(|(e, _)| {
                Error::sink_failed(format!("publishing to `{}`", self.topic), e)
            })?;
        }
        self.producer
            .flush(PUBLISH_TIMEOUT)
            .map_err(|e| Error::sink_failed(format!("publishing to `{}`", self.topic), e))
    }

    fn collect(&mut self) -> Result<Vec<(String, PartitionProgress)>> {
        let mut collected = Vec::new();
        while let Some(message) = self.consumer.poll(Duration::ZERO) {
            // A broker restarting: what is not read now is read at a later
            // collect (the exchange is advisory; waiting for it only holds
            // the watermark back), so the query goes on without it.
            let message = match message {
                Ok(message) => message,
                Err(e) => {
                    if let Some(times) = self.read_warning.occurred() {
                        tracing::warn!(topic = %self.topic, error = %e, times, "reading the watermark exchange failed; read again at the next batch");
                    }
                    break;
                }
            };
            let key = message.key().and_then(|k| std::str::from_utf8(k).ok());
            let read_until = message.headers().and_then(|headers| {
                headers
                    .iter()
                    .find(|h| h.key == READ_UNTIL_HEADER)
                    .and_then(|h| h.value)
            });
            let value = message.payload().and_then(|v| decode(v, read_until));
            match (key, value) {
                (Some(input), Some(progress)) => collected.push((input.to_string(), progress)),
                // Written by something else: it moves no watermark.
                _ => {
                    tracing::warn!(topic = %self.topic, offset = message.offset(), "an unreadable record in the watermark exchange; skipped")
                }
            }
        }
        Ok(collected)
    }
}

/// The progress in a record's `value` (the event time) and its
/// [`READ_UNTIL_HEADER`] (`read_until`, absent from an earlier version's);
/// `None` when either is not a decimal number.
fn decode(value: &[u8], read_until: Option<&[u8]>) -> Option<PartitionProgress> {
    let number = |bytes: &[u8]| std::str::from_utf8(bytes).ok()?.parse::<i64>().ok();
    let read_until_ms = match read_until {
        Some(bytes) => Some(number(bytes)?),
        None => None,
    };
    Some(PartitionProgress {
        max_event_time: number(value)?,
        read_until_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_back_and_an_earlier_versions_record_still_reads() {
        let progress = decode(b"1767225600000123", Some(b"1767225600000"));
        assert_eq!(
            progress,
            Some(PartitionProgress {
                max_event_time: 1_767_225_600_000_123,
                read_until_ms: Some(1_767_225_600_000),
            })
        );
        assert_eq!(decode(b"42", None).map(|p| p.read_until_ms), Some(None));
        for (value, header) in [
            (&b""[..], None),
            (b"x", None),
            (b"1 2", None),
            (b"1", Some(&b"y"[..])),
        ] {
            assert_eq!(decode(value, header), None, "{value:?} {header:?}");
        }
    }
}
