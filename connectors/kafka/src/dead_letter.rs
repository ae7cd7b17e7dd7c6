//! The dead-letter topic: failed records with the error and their position
//! in headers.

use crate::connection::KafkaConnection;
use crate::producer::{producer, send_with_backpressure, DeliveryTracker};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::record::Record;
use tidemark::runtime::DeadLetter;

/// Header names written on each dead letter.
pub const ERROR_HEADER: &str = "tidemark.error";
/// Source topic header.
pub const TOPIC_HEADER: &str = "tidemark.source.topic";
/// Source partition header.
pub const PARTITION_HEADER: &str = "tidemark.source.partition";
/// Source offset header.
pub const OFFSET_HEADER: &str = "tidemark.source.offset";

/// Sends failed records, unchanged, to a topic.
pub struct KafkaDeadLetter {
    topic: String,
    producer: ThreadedProducer<DeliveryTracker>,
    tracker: DeliveryTracker,
    /// Exactly-once: dead letters are written in the batch's transaction.
    transactions: Option<crate::SharedTransactions>,
}

impl KafkaDeadLetter {
    /// A dead-letter output to `topic`.
    pub fn new(cluster: &KafkaConnection, topic: &str) -> Result<Self> {
        let (producer, tracker) = producer(cluster, "dead-letter producer")?;
        Ok(KafkaDeadLetter {
            topic: topic.to_string(),
            producer,
            tracker,
            transactions: None,
        })
    }

    /// Writes dead letters inside `transactions` (exactly-once): they
    /// become visible to `read_committed` readers with the batch's output
    /// and offsets, and a batch that aborts and is replayed leaves each of
    /// its bad records once, not twice.
    pub fn with_transactions(mut self, transactions: crate::SharedTransactions) -> Self {
        self.transactions = Some(transactions);
        self
    }
}

impl DeadLetter for KafkaDeadLetter {
    fn send(&mut self, record: &Record, error: &Error) -> Result<()> {
        let in_transaction = self.transactions.is_some();
        self.write(record, error, in_transaction)
    }

    fn send_between_batches(&mut self, record: &Record, error: &Error) -> Result<()> {
        // No batch's transaction may follow to commit it: its own producer,
        // flushed before the feed moves on.
        self.write(record, error, false)?;
        self.flush_own_producer()
    }

    fn flush(&mut self) -> Result<()> {
        if self.transactions.is_some() {
            // The source commits the transaction, dead letters with it.
            return Ok(());
        }
        self.flush_own_producer()
    }
}

impl KafkaDeadLetter {
    /// Sends `record` with `error` in headers, in the batch's transaction
    /// or through the dead letter's own producer.
    fn write(&mut self, record: &Record, error: &Error, in_transaction: bool) -> Result<()> {
        tracing::warn!(position = %record.position, %error, topic = %self.topic, "bad record sent to dead-letter topic");
        metrics::counter!("tidemark_dead_letters_total").increment(1);
        let error_text = error.to_string();
        let partition = record.position.partition.to_string();
        let offset = record.position.offset.to_string();
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: ERROR_HEADER,
                value: Some(error_text.as_bytes()),
            })
            .insert(Header {
                key: TOPIC_HEADER,
                value: Some(record.position.topic.as_bytes()),
            })
            .insert(Header {
                key: PARTITION_HEADER,
                value: Some(partition.as_bytes()),
            })
            .insert(Header {
                key: OFFSET_HEADER,
                value: Some(offset.as_bytes()),
            });
        for (k, v) in &record.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_slice()),
            });
        }
        let mut out = BaseRecord::<[u8], [u8]>::to(&self.topic).headers(headers);
        if let Some(v) = record.value.as_deref() {
            out = out.payload(v);
        }
        if let Some(k) = record.key.as_deref() {
            out = out.key(k);
        }
        match &self.transactions {
            Some(t) if in_transaction => t.send(out),
            _ => send_with_backpressure(&self.producer, out)
                .map_err(|e| Error::sink_failed(format!("dead-letter topic `{}`", self.topic), e)),
        }
    }

    /// Waits until what went through the dead letter's own producer is
    /// acknowledged.
    fn flush_own_producer(&mut self) -> Result<()> {
        crate::producer::flush_producer(&self.producer, Duration::from_secs(60)).map_err(|e| {
            Error::sink_failed(format!("flushing dead-letter topic `{}`", self.topic), e)
        })?;
        let failures = self.tracker.take_failures();
        if let Some(permanent) = crate::producer::permanent_failure(&failures) {
            return Err(permanent);
        }
        if let Some(first) = failures.first() {
            return Err(Error::Sink(format!(
                "dead-letter topic `{}`: {first}",
                self.topic
            )));
        }
        Ok(())
    }
}
