//! Changelog topics: `<application_id>-<store>-changelog`, compacted, one
//! partition per task partition. The writer appends each store change; the
//! reader replays a partition up to its end to restore a task's state.

use crate::connection::KafkaConnection;
use crate::producer::{producer, send_with_backpressure, DeliveryTracker};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark::runtime::retry::{Backoff, RepeatedWarning, WARNING_INTERVAL};
use tidemark_state::{ChangelogChunk, ChangelogRecord, ChangelogWriter, StateError};

/// The header naming the encoding version of a changelog record's key and
/// value (as Kafka Streams marks its changelog records, `v`).
const VERSION_HEADER: &str = "v";

/// The encoding of the changelog records this release writes: the store's
/// key and value bytes as the operator wrote them. A record without the
/// header was written before versions were recorded (version 1); a higher
/// one, by a newer release, is refused when restored rather than misread.
pub const CHANGELOG_VERSION: u8 = 1;

/// Refuses a changelog record `m` of an encoding newer than
/// [`CHANGELOG_VERSION`], naming its topic, partition and offset.
pub(crate) fn check_record_version(m: &impl Message) -> Result<()> {
    let what = || {
        format!(
            "changelog record `{}`/{} at offset {}",
            m.topic(),
            m.partition(),
            m.offset()
        )
    };
    let header = m
        .headers()
        .and_then(|headers| headers.iter().find(|h| h.key == VERSION_HEADER));
    match header.map(|h| h.value.unwrap_or_default()) {
        // Written before versions.
        None => Ok(()),
        Some(&[version]) if version >= 1 => {
            tidemark::encoding::check_version(what, version.into(), CHANGELOG_VERSION.into())
        }
        // Not one byte from 1 up: no version this release wrote.
        Some(other) => Err(tidemark::encoding::unknown(
            what,
            format!("{other:?}"),
            CHANGELOG_VERSION.into(),
        )),
    }
}

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
    pub fn new(cluster: &KafkaConnection, application_id: &str) -> Result<Self> {
        let (producer, tracker) = producer(cluster, "changelog writer")?;
        Ok(KafkaChangelogWriter {
            application_id: Arc::from(application_id),
            producer,
            tracker,
            transactions: None,
        })
    }

    /// The tracker of the producer this writer's records go through.
    fn delivery_tracker(&self) -> DeliveryTracker {
        match &self.transactions {
            Some(t) => t.delivery_tracker(),
            None => self.tracker.clone(),
        }
    }

    /// Notes from now on how far this writer's acknowledged records of the
    /// changelog `topic` reach.
    pub(crate) fn track(&self, topic: &str) {
        self.delivery_tracker().track_written_end(topic);
    }

    /// The offset after the last record of `topic`/`partition` this writer
    /// got acknowledged (in a transaction: written, committed or not);
    /// `None` when it wrote none since [`KafkaChangelogWriter::track`].
    pub(crate) fn written_end(&self, topic: &str, partition: i32) -> Option<i64> {
        self.delivery_tracker().written_end(topic, partition)
    }

    /// Waits until every change appended so far is acknowledged: called at
    /// the checkpoint, before offsets commit.
    pub fn flush(&self) -> Result<()> {
        if self.transactions.is_some() {
            // Committed with the transaction.
            return Ok(());
        }
        crate::producer::flush_producer(&self.producer, Duration::from_secs(60))
            .map_err(|e| Error::sink_failed("flushing changelogs", e))?;
        let failures = self.tracker.take_failures();
        if let Some(permanent) = crate::producer::permanent_failure(&failures) {
            return Err(permanent);
        }
        match failures.first() {
            Some(e) => Err(Error::sink_failed(
                "changelog record not acknowledged",
                e.clone(),
            )),
            None => Ok(()),
        }
    }
}

impl ChangelogWriter for KafkaChangelogWriter {
    fn append(&mut self, record: ChangelogRecord) -> std::result::Result<(), StateError> {
        let topic = changelog_topic(&self.application_id, &record.store);
        let mut out = BaseRecord::<[u8], [u8]>::to(&topic)
            .key(&record.key)
            .partition(record.partition)
            .headers(OwnedHeaders::new_with_capacity(1).insert(Header {
                key: VERSION_HEADER,
                value: Some(&[CHANGELOG_VERSION]),
            }));
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

/// The first and the end offset of a changelog partition, the end being the
/// high watermark (see [`crate::admin::high_watermark_client`]): a restore
/// that stopped at the last stable offset would miss the last batch's state
/// right after its commit, under offsets already past its input.
pub fn changelog_watermarks(
    cluster: &KafkaConnection,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64)> {
    crate::admin::high_watermark_client(cluster)?
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .map_err(|e| Error::source_failed(format!("end offset of `{topic}`/{partition}"), e))
}

/// Reads partition `partition` of a changelog from `from` (or the start) to
/// its current end; returns the records and the end offset reached. Holds
/// the whole partition in memory: for tests and tools. Tasks restore with
/// [`restore_changelog`].
pub fn read_changelog(
    cluster: &KafkaConnection,
    application_id: &str,
    store: &str,
    partition: i32,
    from: Option<i64>,
) -> Result<(Vec<ChangelogRecord>, i64)> {
    let mut records = Vec::new();
    let (_, end) = restore_changelog(
        cluster,
        application_id,
        store,
        partition,
        from,
        RestoreOptions::default(),
        &mut |chunk| {
            records.extend(chunk.iter().map(|(key, value)| ChangelogRecord {
                store: store.to_string(),
                partition,
                key: key.to_vec(),
                value: value.map(<[u8]>::to_vec),
            }));
            Ok(())
        },
    )?;
    Ok((records, end))
}

/// How a restore reads its changelog partition.
#[derive(Debug, Clone, Copy)]
pub struct RestoreOptions {
    /// Give up when the position has not moved for this long (the broker
    /// is away, or a transaction stays open): progress, not the size of
    /// the changelog, decides. Default 5 minutes.
    pub stall_timeout: Duration,
    /// Records held before they are handed on (default 10,000)...
    pub chunk_records: usize,
    /// ...or bytes of keys and values (default 8 MiB), whichever comes
    /// first: what a restore holds in memory, whatever the partition's size.
    pub chunk_bytes: usize,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            stall_timeout: Duration::from_secs(300),
            chunk_records: 10_000,
            chunk_bytes: 8 << 20,
        }
    }
}

/// Streams partition `partition` of a changelog, from `from` (or the start)
/// to its end when the restore began, into `apply` in chunks bounded by
/// `options`; returns the records restored and the end offset reached.
pub fn restore_changelog(
    cluster: &KafkaConnection,
    application_id: &str,
    store: &str,
    partition: i32,
    from: Option<i64>,
    options: RestoreOptions,
    apply: &mut dyn FnMut(&ChangelogChunk) -> Result<()>,
) -> Result<(u64, i64)> {
    let topic = changelog_topic(application_id, store);
    let (low, high) = changelog_watermarks(cluster, &topic, partition)?;
    let start = from.unwrap_or(low).max(low);
    if start >= high {
        return Ok((0, high));
    }
    let consumer = restore_consumer(cluster, application_id, &topic, partition, start)?;
    let mut chunk = ChangelogChunk::default();
    let mut restored = 0u64;
    let started = Instant::now();
    let (mut last_report, mut last_progress) = (started, started);
    let mut next = start;
    let (mut polls, mut idle, mut progress_seen_at) = (0u32, false, start);
    // A broker restarting answers every poll with an error at once.
    let mut error_backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut error_warning = RepeatedWarning::new(WARNING_INTERVAL);
    while next < high {
        polls = polls.wrapping_add(1);
        // The clock is read every 1,024 records (and after an empty poll):
        // read per record it took 8% of a restore.
        if idle || polls % 1024 == 0 {
            let now = Instant::now();
            if next > progress_seen_at {
                (progress_seen_at, last_progress) = (next, now);
            } else if now - last_progress > options.stall_timeout {
                return Err(Error::Source(format!(
                    "restoring `{topic}`/{partition}: no progress for {:?} at offset {next} of {high} (state.restore_stall_timeout)",
                    options.stall_timeout
                )));
            }
            if now - last_report >= Duration::from_secs(5) {
                last_report = now;
                tracing::info!(
                    topic,
                    partition,
                    records = restored,
                    remaining = high - next,
                    rate_per_s = restored as f64 / started.elapsed().as_secs_f64(),
                    "restoring"
                );
            }
        }
        (next, idle) = match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                error_backoff.succeeded();
                check_record_version(&m)?;
                chunk.push(m.key().unwrap_or_default(), m.payload());
                restored += 1;
                (next.max(m.offset() + 1), false)
            }
            Some(Err(e)) => {
                if let Some(times) = error_warning.occurred() {
                    tracing::warn!(error = %e, topic, partition, times, "restore consumer error; retrying");
                }
                error_backoff.wait_after_failure(None);
                (next, true)
            }
            // Transaction markers and aborted records take offsets without
            // being handed out: the position moves past them.
            None => {
                let position = consumer
                    .position()
                    .ok()
                    .and_then(|p| p.find_partition(&topic, partition)?.offset().to_raw());
                (next.max(position.unwrap_or(next)), true)
            }
        };
        if chunk.len() >= options.chunk_records || chunk.bytes() >= options.chunk_bytes {
            apply(&chunk)?;
            chunk.clear();
        }
    }
    apply(&chunk)?;
    Ok((restored, high))
}

/// A `read_committed` consumer assigned to `topic`/`partition` at `start`.
fn restore_consumer(
    cluster: &KafkaConnection,
    application_id: &str,
    topic: &str,
    partition: i32,
    start: i64,
) -> Result<BaseConsumer> {
    let mut config = cluster.client_config(&[
        ("fetch.queue.backoff.ms", crate::FETCH_QUEUE_BACKOFF_MS),
        // One partition read end to end: larger fetches, fewer round trips.
        ("max.partition.fetch.bytes", "8388608"),
    ]);
    config
        .set("group.id", format!("{application_id}-restore"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer = cluster.create_plain(&config, "restore consumer")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(start))
        .map_err(|e| Error::source_failed("an offset list", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| Error::source_failed(format!("assigning `{topic}`"), e))?;
    Ok(consumer)
}
