//! A global table's feed: every partition of a (compacted) topic, read
//! whole at start and caught up between batches (Kafka Streams'
//! GlobalKTable, which every instance reads in full).

use crate::connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark::record::{Record, SourcePosition};
use tidemark::runtime::retry::{Backoff, RepeatedWarning, WARNING_INTERVAL};
use tidemark::runtime::TableFeed;

/// Reads every partition of `topic` from the beginning, outside any
/// consumer group (no offsets are committed: the table is read again at
/// each start).
pub struct KafkaTableFeed {
    consumer: BaseConsumer,
    /// Asks for the partitions' ends counting uncommitted records: a
    /// catch-up right after a writer's commit must wait for its markers
    /// rather than stop before its records (see
    /// [`crate::admin::high_watermark_client`]).
    end_offsets: BaseConsumer,
    topic: String,
    partitions: Vec<i32>,
    /// The next offset to read, by partition.
    next: BTreeMap<i32, i64>,
}

/// How long catching up may take before it is an error.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(300);

impl KafkaTableFeed {
    /// A feed of `topic` on `cluster`.
    pub fn new(cluster: &KafkaConnection, topic: &str) -> Result<Self> {
        let mut config = cluster.client_config(&[
            ("fetch.queue.backoff.ms", crate::FETCH_QUEUE_BACKOFF_MS),
            ("isolation.level", "read_committed"),
        ]);
        config
            .set("group.id", format!("tidemark-global-table-{topic}"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest");
        let consumer: BaseConsumer = cluster.create_plain(&config, "global table consumer")?;
        let count = crate::partition_count(cluster, topic)?;
        let partitions: Vec<i32> = (0..count).collect();
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)
                .map_err(|e| Error::source_failed("an offset list", e))?;
        }
        consumer
            .assign(&tpl)
            .map_err(|e| Error::source_failed(format!("assigning `{topic}`"), e))?;
        Ok(KafkaTableFeed {
            consumer,
            end_offsets: crate::admin::high_watermark_client(cluster)?,
            topic: topic.to_string(),
            next: partitions.iter().map(|p| (*p, 0)).collect(),
            partitions,
        })
    }

    /// Where the consumer stands in `partition` (past transaction markers).
    fn position(&self, partition: i32) -> Option<i64> {
        self.consumer
            .position()
            .ok()?
            .find_partition(&self.topic, partition)?
            .offset()
            .to_raw()
    }
}

impl TableFeed for KafkaTableFeed {
    fn describe(&self) -> String {
        format!("GlobalTable[{}]", self.topic)
    }

    fn catch_up(&mut self) -> Result<Vec<Record>> {
        let mut ends = BTreeMap::new();
        for p in &self.partitions {
            let (_, high) = self
                .end_offsets
                .fetch_watermarks(&self.topic, *p, Duration::from_secs(10))
                .map_err(|e| Error::source_failed(format!("end of `{}`/{p}", self.topic), e))?;
            ends.insert(*p, high);
        }
        let deadline = Instant::now() + CATCH_UP_LIMIT;
        let mut records = Vec::new();
        // A broker restarting answers every poll with an error at once.
        let mut error_backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        let mut error_warning = RepeatedWarning::new(WARNING_INTERVAL);
        while ends.iter().any(|(p, end)| self.next[p] < *end) {
            if Instant::now() > deadline {
                return Err(Error::Source(format!(
                    "global table `{}`: not caught up with {ends:?} after {CATCH_UP_LIMIT:?}",
                    self.topic
                )));
            }
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    self.next.insert(m.partition(), m.offset() + 1);
                    records.push(Record {
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        timestamp_ms: m.timestamp().to_millis(),
                        headers: Vec::new(),
                        position: SourcePosition::new(
                            self.topic.as_str(),
                            m.partition(),
                            m.offset(),
                        ),
                    });
                }
                Some(Err(e)) => {
                    if let Some(times) = error_warning.occurred() {
                        tracing::warn!(error = %e, topic = %self.topic, times, "global table consumer error; retrying");
                    }
                    error_backoff.wait_after_failure(Some(deadline));
                }
                // Transaction markers take offsets without records.
                None => {
                    for p in self.partitions.clone() {
                        if let Some(position) = self.position(p) {
                            let slot = self.next.entry(p).or_insert(0);
                            *slot = (*slot).max(position);
                        }
                    }
                }
            }
        }
        Ok(records)
    }
}
