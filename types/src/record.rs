//! Raw records as they come from a source, before decoding.

use std::fmt;
use std::sync::Arc;

/// Where a record came from: topic (or file), partition and offset (or line).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SourcePosition {
    /// Kafka topic, or the file path for the file source.
    pub topic: Arc<str>,
    /// Kafka partition; 0 for files.
    pub partition: i32,
    /// Kafka offset, or the 0-based line number in the file.
    pub offset: i64,
}

impl SourcePosition {
    /// A position from its parts.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32, offset: i64) -> Self {
        SourcePosition {
            topic: topic.into(),
            partition,
            offset,
        }
    }
}

impl fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// One raw input record: key and value bytes, broker timestamp, headers and
/// position.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    /// The record key, if any.
    pub key: Option<Vec<u8>>,
    /// The payload, if any (a Kafka tombstone has none).
    pub value: Option<Vec<u8>>,
    /// The broker or producer timestamp in milliseconds, if any.
    pub timestamp_ms: Option<i64>,
    /// Headers in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Where the record came from.
    pub position: SourcePosition,
}
