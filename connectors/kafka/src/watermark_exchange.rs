//! The query-wide watermark's exchange on Kafka: one compacted topic per
//! application, `<application_id>-watermarks`, one record per input
//! partition (key `topic/partition`, value its largest committed event time
//! in microseconds, then a space and the largest record timestamp read from
//! it in milliseconds), written by whichever instance holds the partition
//! and read whole by every instance. A value of the event time alone (an
//! earlier version's) is read too.

use crate::connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::runtime::{PartitionProgress, WatermarkExchange};
use tidemark::time::TimestampMicros;

/// Shares input partitions' progress between the instances of a query
/// through the compacted topic `topic` (see the module's documentation).
pub struct KafkaWatermarkExchange {
    producer: ThreadedProducer<DefaultProducerContext>,
    consumer: BaseConsumer,
    topic: String,
}

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
            .map_err(|e| Error::Source(e.to_string()))?;
        consumer
            .assign(&partitions)
            .map_err(|e| Error::Source(format!("assigning `{topic}`: {e}")))?;
        Ok(KafkaWatermarkExchange {
            producer,
            consumer,
            topic: topic.to_string(),
        })
    }
}

impl WatermarkExchange for KafkaWatermarkExchange {
    fn publish(&mut self, progress: &BTreeMap<String, PartitionProgress>) -> Result<()> {
        for (input, progress) in progress {
            let value = encode(progress);
            self.producer
                .send(BaseRecord::to(&self.topic).key(input).payload(&value))
                .map_err(|(e, _)| Error::Sink(format!("publishing to `{}`: {e}", self.topic)))?;
        }
        self.producer
            .flush(PUBLISH_TIMEOUT)
            .map_err(|e| Error::Sink(format!("publishing to `{}`: {e}", self.topic)))
    }

    fn collect(&mut self) -> Result<Vec<(String, PartitionProgress)>> {
        let mut collected = Vec::new();
        while let Some(message) = self.consumer.poll(Duration::ZERO) {
            let message =
                message.map_err(|e| Error::Source(format!("reading `{}`: {e}", self.topic)))?;
            let key = message.key().and_then(|k| std::str::from_utf8(k).ok());
            let value = message
                .payload()
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(decode);
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

/// `max_event_time[ read_until_ms]`, in decimal.
fn encode(progress: &PartitionProgress) -> String {
    match progress.read_until_ms {
        Some(ms) => format!("{} {ms}", progress.max_event_time),
        None => progress.max_event_time.to_string(),
    }
}

/// The progress [`encode`] wrote, or an earlier version's event time alone.
fn decode(value: &str) -> Option<PartitionProgress> {
    let mut fields = value.split(' ');
    let max_event_time = fields.next()?.parse::<TimestampMicros>().ok()?;
    let read_until_ms = match fields.next() {
        Some(ms) => Some(ms.parse::<i64>().ok()?),
        None => None,
    };
    fields.next().is_none().then_some(PartitionProgress {
        max_event_time,
        read_until_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_back_and_an_earlier_versions_value_still_reads() {
        for read_until_ms in [Some(1_767_225_600_000), None] {
            let progress = PartitionProgress {
                max_event_time: 1_767_225_600_000_123,
                read_until_ms,
            };
            assert_eq!(decode(&encode(&progress)), Some(progress));
        }
        assert_eq!(decode("42").map(|p| p.read_until_ms), Some(None));
        for garbage in ["", "x", "1 2 3", "1 y"] {
            assert_eq!(decode(garbage), None, "{garbage:?}");
        }
    }
}
