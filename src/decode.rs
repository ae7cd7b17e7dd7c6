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
        let json: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| Error::BadRecord {
                position: record.position.clone(),
                field: "<value>".into(),
                reason: format!("malformed JSON: {e}"),
            })?;
        self.schema.row_from_json(&json, &record.position)
    }
}
