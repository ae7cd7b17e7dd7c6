//! The JSON decoder (Avro lives in `tidemark-connectors`).

use crate::error::{Error, Result};
use crate::record::Record;
use crate::row::Row;
use crate::runtime::Decoder;
use crate::schema::Schema;

/// Decodes a record's value as one JSON object, typed by a [`Schema`] (or
/// with types inferred when the schema is empty).
///
/// ```
/// use tidemark::decode::JsonDecoder;
/// use tidemark::record::Record;
/// use tidemark::runtime::Decoder;
/// use tidemark::schema::Schema;
/// let mut d = JsonDecoder::new(Schema::default());
/// let record = Record { value: Some(br#"{"id": "a"}"#.to_vec()), ..Default::default() };
/// assert_eq!(d.decode(&record).unwrap().get("id").unwrap().to_string(), "a");
/// ```
#[derive(Debug, Clone, Default)]
pub struct JsonDecoder {
    schema: Schema,
}

impl JsonDecoder {
    /// A decoder for `schema`.
    pub fn new(schema: Schema) -> Self {
        JsonDecoder { schema }
    }
}

impl Decoder for JsonDecoder {
    fn decode(&mut self, record: &Record) -> Result<Row> {
        let bytes = record.value.as_deref().ok_or_else(|| Error::BadRecord {
            position: record.position.clone(),
            field: "<value>".into(),
            reason: "the record has no value (tombstone)".into(),
        })?;
        crate::json_row::decode_row(&self.schema, bytes, &record.position)
    }
}

/// Decodes each topic's records with its own decoder (a join's two
/// streams have different columns), the rest with a default one.
pub struct ByTopicDecoder {
    by_topic: std::collections::HashMap<String, Box<dyn Decoder>>,
    default: Box<dyn Decoder>,
}

impl ByTopicDecoder {
    /// Records of topics without a decoder of their own go to `default`.
    pub fn new(default: Box<dyn Decoder>) -> Self {
        ByTopicDecoder {
            by_topic: Default::default(),
            default,
        }
    }

    /// Decodes the records of `topic` with `decoder`.
    pub fn topic(mut self, topic: &str, decoder: Box<dyn Decoder>) -> Self {
        self.by_topic.insert(topic.to_string(), decoder);
        self
    }
}

impl Decoder for ByTopicDecoder {
    fn decode(&mut self, record: &Record) -> Result<Row> {
        match self.by_topic.get_mut(record.position.topic.as_ref()) {
            Some(d) => d.decode(record),
            None => self.default.decode(record),
        }
    }
}
