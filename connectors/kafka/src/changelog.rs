//! Changelog topics: `<application_id>-<store>-changelog`, compacted, one
//! partition per task partition. The writer appends each store change; the
//! reader replays a partition up to its end to restore a task's state.

use crate::producer::{producer, send_with_backpressure, DeliveryTracker};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark_state::{ChangelogRecord, ChangelogWriter, StateError};

/// The changelog topic of `store` in `application_id`.
pub fn changelog_topic(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}

/// Appends store changes to their changelog topics; cheap to clone (one
/// producer shared by every store of an instance).
#[derive(Clone)]
pub struct KafkaChangelogWriter {
    application_id: Arc<str>,
    producer: ThreadedProducer<DeliveryTracker>,
    tracker: DeliveryTracker,
    transactions: Option<super::SharedTransactions>,
}

impl KafkaChangelogWriter {
    /// Appends inside `transactions` (exactly-once): changes commit with
    /// the batch's output and offsets.
    pub fn with_transactions(mut self, transactions: super::SharedTransactions) -> Self {
        self.transactions = Some(transactions);
        self
    }

    /// A writer for `application_id`'s changelogs.
    pub fn new(bootstrap: &str, application_id: &str) -> Result<Self> {
        let (producer, tracker) = producer(bootstrap, &BTreeMap::new(), "changelog")?;
        Ok(KafkaChangelogWriter {
            application_id: Arc::from(application_id),
            producer,
            tracker,
            transactions: None,
        })
    }

    /// Waits until every change appended so far is acknowledged: called at
    /// the checkpoint, before offsets commit.
    pub fn flush(&self) -> Result<()> {
        if self.transactions.is_some() {
            // Committed with the transaction.
            return Ok(());
        }
        crate::producer::flush_producer(&self.producer, Duration::from_secs(60))
            .map_err(|e| Error::Sink(format!("flushing changelogs: {e}")))?;
        match self.tracker.take_failures().first() {
            Some(e) => Err(Error::Sink(format!(
                "changelog record not acknowledged: {e}"
            ))),
            None => Ok(()),
        }
    }
}

impl ChangelogWriter for KafkaChangelogWriter {
    fn append(&mut self, record: ChangelogRecord) -> std::result::Result<(), StateError> {
        let topic = changelog_topic(&self.application_id, &record.store);
        let mut out = BaseRecord::<[u8], [u8]>::to(&topic)
            .key(&record.key)
            .partition(record.partition);
        // No payload: a tombstone, which compaction removes with the key.
        if let Some(v) = record.value.as_deref() {
            out = out.payload(v);
        }
        let result = match &self.transactions {
            Some(t) => t.send(out).map_err(|e| e.to_string()),
            None => send_with_backpressure(&self.producer, out).map_err(|e| e.to_string()),
        };
        result.map_err(|e| StateError::Backend {
            store: record.store.clone(),
            reason: format!("changelog `{topic}`: {e}"),
        })
    }
}

/// Reads partition `partition` of a changelog from `from` (or the start) to
/// its current end; returns the records and the end offset reached.
pub fn read_changelog(
    bootstrap: &str,
    application_id: &str,
    store: &str,
    partition: i32,
    from: Option<i64>,
) -> Result<(Vec<ChangelogRecord>, i64)> {
    let topic = changelog_topic(application_id, store);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{application_id}-restore"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.queue.backoff.ms", crate::FETCH_QUEUE_BACKOFF_MS)
        .create()
        .map_err(|e| Error::Source(format!("restore consumer: {e}")))?;
    let (low, high) = consumer
        .fetch_watermarks(&topic, partition, Duration::from_secs(10))
        .map_err(|e| Error::Source(format!("end offset of `{topic}`/{partition}: {e}")))?;
    let start = from.unwrap_or(low).max(low);
    let mut records = Vec::new();
    if start >= high {
        return Ok((records, high));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, partition, Offset::Offset(start))
        .map_err(|e| Error::Source(e.to_string()))?;
    consumer
        .assign(&tpl)
        .map_err(|e| Error::Source(format!("assigning `{topic}`: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let started = Instant::now();
    let mut last_report = started;
    let mut next = start;
    while next < high {
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            tracing::info!(
                topic,
                partition,
                records = records.len(),
                remaining = high - next,
                rate_per_s = records.len() as f64 / started.elapsed().as_secs_f64(),
                "restoring"
            );
        }
        if Instant::now() > deadline {
            return Err(Error::Source(format!(
                "restoring `{topic}`/{partition}: stuck at offset {next} of {high}"
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                next = m.offset() + 1;
                records.push(ChangelogRecord {
                    store: store.to_string(),
                    partition,
                    key: m.key().unwrap_or_default().to_vec(),
                    value: m.payload().map(<[u8]>::to_vec),
                });
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, topic, partition, "restore consumer error; retrying")
            }
            // Transaction markers take offsets without records.
            None => {
                next = next.max(
                    consumer
                        .position()
                        .ok()
                        .and_then(|p| p.find_partition(&topic, partition)?.offset().to_raw())
                        .unwrap_or(next),
                )
            }
        }
    }
    Ok((records, high))
}
