//! Where a source stands: the position a progress report shows as a
//! batch's `startOffset`/`endOffset`, a sink records with the batch it
//! commits (Delta's `txn`, a Kafka sink's progress record) and the query
//! replays a batch up to after a crash.
//!
//! Its JSON form is Spark's, as the releases that passed the JSON itself
//! around wrote it: `{"orders": {"0": 42, "1": 7}}` for partitioned input
//! (the next offset to read of each partition, partitions in number
//! order), `{"logOffset": 3}` for a source that numbers its own log,
//! `null` when the source does not say. Sinks store it versioned
//! ([`SourceOffsets::to_stored`]); the bare form records of earlier
//! releases hold reads back as it was, whatever a source put in it.

use std::collections::BTreeMap;
use std::fmt;
#[cfg(doc)]
use tidemark_types::error::Error;
use tidemark_types::error::Result;

/// The next offset to read of each partition, by topic then partition.
pub type PartitionOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// A source's position (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SourceOffsets {
    /// The source does not say (JSON `null`).
    #[default]
    Unknown,
    /// The next offset to read of each partition (Kafka).
    Partitions(PartitionOffsets),
    /// A position in the source's own sequence, under the name its JSON
    /// gives it: the files source's `logOffset` (its batch log), a
    /// generator's count of events.
    Sequence {
        /// The name of the position (`logOffset`).
        name: String,
        /// The position.
        position: i64,
    },
    /// A position of another shape (a source of an application's own),
    /// kept and shown as it is.
    Other(serde_json::Value),
}

impl SourceOffsets {
    /// Partitioned offsets from `(topic, partition, next offset)`s.
    pub fn of_partitions<'a>(offsets: impl IntoIterator<Item = (&'a str, i32, i64)>) -> Self {
        let mut by_topic = PartitionOffsets::new();
        for (topic, partition, offset) in offsets {
            by_topic
                .entry(topic.to_string())
                .or_default()
                .insert(partition, offset);
        }
        SourceOffsets::Partitions(by_topic)
    }

    /// A position named `name` in the source's own sequence.
    pub fn sequence(name: impl Into<String>, position: i64) -> Self {
        SourceOffsets::Sequence {
            name: name.into(),
            position,
        }
    }

    /// The next offset of `topic`'s `partition`, when partitioned offsets
    /// name it.
    pub fn offset_of(&self, topic: &str, partition: i32) -> Option<i64> {
        match self {
            SourceOffsets::Partitions(by_topic) => by_topic.get(topic)?.get(&partition).copied(),
            _ => None,
        }
    }

    /// Whether the source said nothing.
    pub fn is_unknown(&self) -> bool {
        matches!(self, SourceOffsets::Unknown)
    }

    /// Spark's JSON form (partitions as text keys, as Spark writes them).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::{Map, Value};
        match self {
            SourceOffsets::Unknown => Value::Null,
            SourceOffsets::Partitions(by_topic) => Value::Object(
                by_topic
                    .iter()
                    .map(|(topic, partitions)| {
                        let partitions: Map<String, Value> = partitions
                            .iter()
                            .map(|(p, offset)| (p.to_string(), Value::from(*offset)))
                            .collect();
                        (topic.clone(), Value::Object(partitions))
                    })
                    .collect(),
            ),
            SourceOffsets::Sequence { name, position } => {
                Value::Object(Map::from_iter([(name.clone(), Value::from(*position))]))
            }
            SourceOffsets::Other(value) => value.clone(),
        }
    }

    /// Reads the JSON form back: an object of topics, each an object of
    /// partition numbers to offsets, or one name with a number; any other
    /// JSON is kept as it is ([`SourceOffsets::Other`]), as the releases
    /// before this type passed it along.
    pub fn from_json(value: &serde_json::Value) -> Self {
        use serde_json::Value;
        let fields = match value {
            Value::Null => return SourceOffsets::Unknown,
            Value::Object(fields) => fields,
            other => return SourceOffsets::Other(other.clone()),
        };
        if let (1, Some((name, position))) = (fields.len(), fields.iter().next()) {
            if let Some(position) = position.as_i64() {
                return SourceOffsets::sequence(name.clone(), position);
            }
        }
        let mut by_topic = PartitionOffsets::new();
        for (topic, partitions) in fields {
            let Value::Object(partitions) = partitions else {
                return SourceOffsets::Other(value.clone());
            };
            let offsets = by_topic.entry(topic.clone()).or_default();
            for (partition, offset) in partitions {
                let (Ok(partition), Some(offset)) = (partition.parse::<i32>(), offset.as_i64())
                else {
                    return SourceOffsets::Other(value.clone());
                };
                offsets.insert(partition, offset);
            }
        }
        SourceOffsets::Partitions(by_topic)
    }
}

/// The encoding of a stored position this release writes:
/// `{"v": 1, "end": <the JSON form>}`. Releases before versions stored the
/// bare JSON form, which still reads.
const STORED_VERSION: u32 = 1;

impl SourceOffsets {
    /// The stored form, versioned (a sink's record of the position at a
    /// batch's end).
    pub fn to_stored(&self) -> serde_json::Value {
        serde_json::json!({"v": STORED_VERSION, "end": self.to_json()})
    }

    /// Reads [`SourceOffsets::to_stored`]'s form, or the bare JSON form of
    /// the releases before versions; a newer version is
    /// [`Error::UnknownEncoding`], naming `what` (where it was stored).
    pub fn from_stored(value: &serde_json::Value, what: &str) -> Result<Self> {
        // A number under "v" marks the versioned form: a bare position
        // never has one at its top (a sequence's name is not `v`, a
        // partitioned position maps a topic, even one named `v`, to an
        // object).
        let Some(fields) = value
            .as_object()
            .filter(|fields| fields.get("v").is_some_and(|v| v.is_number()))
        else {
            return Ok(SourceOffsets::from_json(value));
        };
        tidemark_types::encoding::check_fields_version(
            || format!("the source position in {what}"),
            fields,
            STORED_VERSION,
        )?;
        Ok(SourceOffsets::from_json(
            fields.get("end").unwrap_or(&serde_json::Value::Null),
        ))
    }
}

/// The JSON form, compact (for logs).
impl fmt::Display for SourceOffsets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tidemark_types::error::Error;

    /// Every form reads back from its JSON, which is Spark's.
    #[test]
    fn json_round_trip() {
        let partitioned = SourceOffsets::of_partitions([("orders", 10, 7), ("orders", 2, 42)]);
        // Partitions in number order, as Spark sorts them.
        assert_eq!(
            partitioned.to_json().to_string(),
            r#"{"orders":{"2":42,"10":7}}"#
        );
        assert_eq!(partitioned.offset_of("orders", 10), Some(7));
        assert_eq!(partitioned.offset_of("orders", 1), None);
        let log = SourceOffsets::sequence("logOffset", 3);
        assert_eq!(log.to_json(), json!({"logOffset": 3}));
        let empty_topic =
            SourceOffsets::Partitions(PartitionOffsets::from([("a".to_string(), BTreeMap::new())]));
        for offsets in [
            partitioned,
            log,
            empty_topic,
            SourceOffsets::Unknown,
            SourceOffsets::Partitions(Default::default()),
            SourceOffsets::Other(json!({"a": 1, "b": [2]})),
        ] {
            assert_eq!(SourceOffsets::from_json(&offsets.to_json()), offsets);
        }
    }

    /// JSON of no known shape, which a source of an application's own
    /// could have reported (and a sink stored), is kept as it is.
    #[test]
    fn other_shapes_are_kept_as_they_are() {
        for other in [
            json!(3),
            json!("x"),
            json!({"orders": {"zero": 1}}),
            json!({"orders": {"0": "1"}}),
            json!({"a": 1, "b": 2}),
        ] {
            let offsets = SourceOffsets::from_json(&other);
            assert_eq!(offsets, SourceOffsets::Other(other.clone()));
            assert_eq!(offsets.to_json(), other);
            assert_eq!(offsets.offset_of("orders", 0), None);
        }
    }

    /// The stored form reads back; so does the bare form of the releases
    /// before versions; a newer version is refused.
    #[test]
    fn stored_forms_read_back_and_newer_ones_are_refused() {
        let end = SourceOffsets::of_partitions([("v", 0, 12)]);
        let what = "the record";
        assert_eq!(
            SourceOffsets::from_stored(&end.to_stored(), what).unwrap(),
            end
        );
        // Bare: a topic named `v` maps to an object, not a version.
        assert_eq!(
            SourceOffsets::from_stored(&end.to_json(), what).unwrap(),
            end
        );
        let log = SourceOffsets::sequence("logOffset", 7);
        assert_eq!(
            SourceOffsets::from_stored(&log.to_json(), what).unwrap(),
            log
        );
        assert_eq!(
            SourceOffsets::from_stored(&json!({"v": 1}), what).unwrap(),
            SourceOffsets::Unknown
        );
        for newer in [
            json!({"v": 2, "end": {}}),
            json!({"v": 0, "end": {}}),
            json!({"v": 1.5}),
        ] {
            let e = SourceOffsets::from_stored(&newer, what).unwrap_err();
            assert!(matches!(e, Error::UnknownEncoding { .. }), "{e}");
            assert!(e.to_string().contains(what), "{e}");
        }
    }
}
