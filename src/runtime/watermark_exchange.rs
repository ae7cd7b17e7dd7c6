//! How the instances of one query share event-time progress, so that each
//! computes Spark's query-wide watermark (`watermark_scope: query`) over
//! every partition of its input, not only those it was assigned.
//!
//! After a batch commits, an instance publishes the largest event time each
//! of its input partitions delivered; between batches it collects what the
//! others published and every task's watermark counts it. Only committed
//! progress is published: a batch that aborts and is read again must not
//! find its own rows already behind the watermark.

use crate::error::Result;
use crate::time::TimestampMicros;
use std::collections::BTreeMap;

/// Shares input partitions' progress between the instances of a query
/// (Kafka: an internal compacted topic, see `tidemark_kafka`).
pub trait WatermarkExchange: Send {
    /// Publishes the largest event time each input partition (named
    /// `topic/partition`) delivered, after the batch that read it
    /// committed.
    fn publish(&mut self, progress: &BTreeMap<String, TimestampMicros>) -> Result<()>;

    /// What the query's instances (this one too) published since the last
    /// call, by input partition; the largest time when one appears twice.
    fn collect(&mut self) -> Result<BTreeMap<String, TimestampMicros>>;
}
