//! The query-wide watermark's exchange on Kafka: one compacted topic per
//! application, `<application_id>-watermarks`, one record per input
//! partition (key `topic/partition`, value its largest committed event time
//! in microseconds), written by whichever instance holds the partition and
//! read whole by every instance.

use crate::connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::runtime::WatermarkExchange;
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
    fn publish(&mut self, progress: &BTreeMap<String, TimestampMicros>) -> Result<()> {
        for (input, max_event_time) in progress {
            let value = max_event_time.to_string();
            self.producer
                .send(BaseRecord::to(&self.topic).key(input).payload(&value))
                .map_err(|(e, _)| Error::Sink(format!("publishing to `{}`: {e}", self.topic)))?;
        }
        self.producer
            .flush(PUBLISH_TIMEOUT)
            .map_err(|e| Error::Sink(format!("publishing to `{}`: {e}", self.topic)))
    }

    fn collect(&mut self) -> Result<BTreeMap<String, TimestampMicros>> {
        let mut progress: BTreeMap<String, TimestampMicros> = BTreeMap::new();
        while let Some(message) = self.consumer.poll(Duration::ZERO) {
            let message =
                message.map_err(|e| Error::Source(format!("reading `{}`: {e}", self.topic)))?;
            let key = message.key().and_then(|k| std::str::from_utf8(k).ok());
            let value = message
                .payload()
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.parse::<TimestampMicros>().ok());
            match (key, value) {
                (Some(input), Some(t)) => {
                    let slot = progress.entry(input.to_string()).or_insert(t);
                    *slot = (*slot).max(t);
                }
                // Written by something else: it moves no watermark.
                _ => {
                    tracing::warn!(topic = %self.topic, offset = message.offset(), "an unreadable record in the watermark exchange; skipped")
                }
            }
        }
        Ok(progress)
    }
}
