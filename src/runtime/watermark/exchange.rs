//! How the instances of one query share event-time progress, so that each
//! computes Spark's query-wide watermark (`watermark_scope: query`) over
//! every partition of its input, not only those it was assigned.
//!
//! After a batch commits, an instance publishes the largest event time each
//! of its input partitions delivered, and how far each was read in record
//! timestamps; between batches it collects what the others published and
//! every task's watermark counts it once its own partitions are read as far
//! (see `alignment`). Only committed progress is published: a
//! batch that aborts and is read again must not find its own rows already
//! behind the watermark.

use crate::error::Result;
use crate::time::TimestampMicros;
use std::collections::BTreeMap;

/// One input partition's progress, as an instance publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionProgress {
    /// The largest event time the partition delivered.
    pub max_event_time: TimestampMicros,
    /// The largest record timestamp (milliseconds) read from the partition
    /// when it delivered that: how far it was read in ingestion time.
    /// `None` when not known (published by an earlier version): counted at
    /// once, as then.
    pub read_until_ms: Option<i64>,
}

impl PartitionProgress {
    /// Each field the larger of the two.
    pub fn max_with(self, other: PartitionProgress) -> PartitionProgress {
        PartitionProgress {
            max_event_time: self.max_event_time.max(other.max_event_time),
            read_until_ms: self.read_until_ms.max(other.read_until_ms),
        }
    }
}

/// Shares input partitions' progress between the instances of a query
/// (Kafka: an internal compacted topic, see `tidemark_kafka`).
pub trait WatermarkExchange: Send {
    /// Publishes each input partition's (named `topic/partition`)
    /// progress, after the batch that read it committed.
    fn publish(&mut self, progress: &BTreeMap<String, PartitionProgress>) -> Result<()>;

    /// What the query's instances (this one too) published since the last
    /// call, by input partition, in the order it was published.
    fn collect(&mut self) -> Result<Vec<(String, PartitionProgress)>>;
}
