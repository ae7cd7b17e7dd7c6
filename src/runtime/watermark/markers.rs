//! Watermark markers: how event-time progress crosses a repartition topic.
//!
//! After a repartition, each partition of the internal topic holds rows from
//! every input partition, interleaved in arrival order. A watermark computed
//! from those rows alone would let one input partition that runs ahead make
//! another's rows late. Instead, as in Flink, the writing stage broadcasts a
//! marker to every partition of the repartition topic at each commit,
//! carrying the largest event time each input partition has delivered; the
//! reading stage's watermark is the policy's combination of those (by
//! default the minimum), and rows themselves do not move it. A marker
//! follows the rows it covers in each partition, so a row is late only if
//! its own input partition was out of order by more than the delay.
//!
//! Under Spark's query-wide watermark (`watermark_scope: query`) a stream's
//! watermark is its largest event time over every partition, and a row must
//! only meet the event times of rows that arrived before it. The writer
//! that reads a partition is the one that knows how far it has read: its
//! task keeps a watermark counting the other partitions' progress (this
//! instance's, and the others' through the watermark exchange) only as far
//! as it has read its own (see `alignment`), and its markers carry,
//! for its partition, that stream maximum rather than the partition's own.
//! The reader takes, per stream, the smallest of those reports
//! ([`crate::watermark::WatermarkTracker::with_aligned_inputs`]): a writer
//! with a backlog still to write (after downtime, or one slower than the
//! rest) holds the watermark until its rows are written, instead of the
//! others' progress dropping them as late.

use crate::error::{Error, Result};
use crate::record::Record;
use crate::time::TimestampMicros;
use std::collections::BTreeMap;

/// The header that makes a record a marker rather than a row.
pub const WATERMARK_MARKER_HEADER: &str = "tidemark-watermark";

/// One input partition's event-time progress, as written to a repartition
/// topic.
///
/// ```
/// use tidemark::runtime::WatermarkMarker;
/// let marker = WatermarkMarker {
///     origin: "orders/0".into(),
///     max_event_time: 42,
///     origins: vec!["orders/0".into(), "orders/1".into()],
/// };
/// let bytes = marker.encode();
/// assert_eq!(WatermarkMarker::decode(&bytes).unwrap(), marker);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WatermarkMarker {
    /// The input partition (`topic/partition`) the progress is of.
    pub origin: String,
    /// The largest event time it has delivered, in microseconds; under
    /// the query scope, its stream's largest as far as the writer reading
    /// it may count it (see the module's documentation).
    pub max_event_time: TimestampMicros,
    /// Every input partition of the writing stage: under the `min` policy
    /// one that has reported nothing yet holds the watermark at its start.
    pub origins: Vec<String>,
}

/// The encoding of the markers this release writes: the JSON object with
/// `"v": 1`. A marker without `"v"` predates versions (version 1); one of
/// a newer version is refused, never read as this one.
pub const MARKER_VERSION: u32 = 1;

/// A marker as written: its version beside its fields.
#[derive(serde::Serialize)]
struct VersionedMarker<'a> {
    v: u32,
    #[serde(flatten)]
    marker: &'a WatermarkMarker,
}

impl WatermarkMarker {
    /// The marker's record value.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&VersionedMarker {
            v: MARKER_VERSION,
            marker: self,
        })
        .expect("a marker serializes")
    }

    /// Reads a marker's record value.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        crate::encoding::check_json_version(|| "a watermark marker".into(), bytes, MARKER_VERSION)?;
        serde_json::from_slice(bytes)
            .map_err(|e| Error::source_failed("unreadable watermark marker", e))
    }

    /// The marker `record` carries, if it is one.
    pub fn of_record(record: &Record) -> Option<Result<Self>> {
        record
            .headers
            .iter()
            .any(|(name, _)| name == WATERMARK_MARKER_HEADER)
            .then(|| Self::decode(record.value.as_deref().unwrap_or_default()))
    }
}

/// What a repartition writer under the query scope forwards in its markers
/// at a commit: for each input partition it is assigned (`assigned`, as
/// `(topic, partition)`; silent ones too), the largest event time of its
/// stream that the partition's task counts (see the module's
/// documentation). Only assigned ones: another instance's partition of the
/// same number (a union's other topic) is reported by its own writer.
pub(in crate::runtime) fn forwarded_stream_maxima(
    tasks: &BTreeMap<i32, crate::runtime::task::Task>,
    assigned: &[(String, i32)],
    inputs: &crate::runtime::inputs::Inputs,
    source: &dyn crate::runtime::Source,
) -> BTreeMap<String, TimestampMicros> {
    let mut forwarded = BTreeMap::new();
    for (topic, partition) in assigned {
        let input = inputs.get(inputs.input_of(topic));
        let Some(watermark) = tasks.get(partition).and_then(|t| t.watermark.as_ref()) else {
            continue;
        };
        if !input.watermarked {
            continue;
        }
        if let Some(t) = watermark.stream_max_event_time(input.stream.as_deref()) {
            forwarded.insert(source.watermark_input(topic, *partition), t);
        }
    }
    forwarded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A marker the release before versions wrote reads; this release's
    /// carries `"v": 1`; a newer one is refused.
    #[test]
    fn markers_of_each_encoding_read_or_are_refused() {
        let old = br#"{"origin":"orders/0","max_event_time":42,"origins":["orders/0"]}"#;
        let marker = WatermarkMarker::decode(old).unwrap();
        assert_eq!(marker.max_event_time, 42);
        let bytes = marker.encode();
        assert!(
            bytes.starts_with(br#"{"v":1,"#),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        assert_eq!(WatermarkMarker::decode(&bytes).unwrap(), marker);
        let newer = br#"{"v":2,"origin":"orders/0","progress":[42]}"#;
        let e = WatermarkMarker::decode(newer).unwrap_err();
        assert!(
            matches!(&e, Error::UnknownEncoding { found, .. } if found == "2"),
            "{e}"
        );
    }
}
