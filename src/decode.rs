//! The JSON decoder (Avro lives in `tidemark-connectors`).

use crate::error::{Error, Result};
use crate::record::Record;
use crate::row::Row;
use crate::runtime::Decoder;
use crate::schema::Schema;

pub use crate::json_row::{Slot, TypedSlots};

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
        let bytes = record.value.as_deref().ok_or_else(|| tombstone(record))?;
        crate::json_row::decode_row(&self.schema, bytes, &record.position)
    }

    fn typed_schema(&self, _record: &Record) -> Option<&Schema> {
        (!self.schema.is_empty()).then_some(&self.schema)
    }

    fn decode_typed<'r>(&self, record: &'r Record, schema: &Schema) -> Result<TypedSlots<'r>> {
        let bytes = record.value.as_deref().ok_or_else(|| tombstone(record))?;
        crate::json_row::parse_typed(schema, bytes, &record.position)
    }
}

/// Decodes JSON records of a typed schema straight into Apache Arrow
/// columns (no [`Row`] per record): the same values and errors as
/// [`JsonDecoder`], a bad record leaving the columns as they were.
///
/// ```
/// use tidemark::decode::JsonColumnsDecoder;
/// use tidemark::record::Record;
/// use tidemark::schema::{FieldType, Schema};
/// let schema = Schema::new([("id", FieldType::String), ("n", FieldType::Long)]);
/// let mut d = JsonColumnsDecoder::new(schema).unwrap();
/// let record = |v: &str| Record { value: Some(v.as_bytes().to_vec()), ..Default::default() };
/// d.append(&record(r#"{"id": "a", "n": 1}"#)).unwrap();
/// assert!(d.append(&record(r#"{"id": "b", "n": "many"}"#)).is_err());
/// assert_eq!(d.finish().unwrap().num_rows(), 1);
/// ```
pub struct JsonColumnsDecoder {
    schema: Schema,
    columns: crate::json_columns::JsonColumns,
}

impl JsonColumnsDecoder {
    /// A decoder into the columns of `schema`, which must list them (an
    /// empty schema infers types per record, which columns cannot).
    pub fn new(schema: Schema) -> Result<Self> {
        if schema.is_empty() {
            return Err(Error::config(
                "schema",
                "decoding into columns needs a schema listing the columns and their types",
            ));
        }
        Ok(JsonColumnsDecoder {
            columns: crate::json_columns::JsonColumns::new(&schema),
            schema,
        })
    }

    /// Decodes `record` onto the end of the columns, or says why it is bad
    /// (naming the record, the field and the reason).
    pub fn append(&mut self, record: &Record) -> Result<()> {
        let bytes = record.value.as_deref().ok_or_else(|| tombstone(record))?;
        let slots = crate::json_row::parse_typed(&self.schema, bytes, &record.position)?;
        self.columns.append(slots);
        Ok(())
    }

    /// The records decoded since the last call, as one batch.
    pub fn finish(&mut self) -> Result<arrow_array::RecordBatch> {
        self.columns.finish()
    }
}

/// Why a record without a value is not a JSON object.
pub(crate) fn tombstone(record: &Record) -> Error {
    Error::BadRecord {
        position: record.position.clone(),
        field: "<value>".into(),
        reason: "the record has no value (tombstone)".into(),
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

    fn typed_schema(&self, record: &Record) -> Option<&Schema> {
        match self.by_topic.get(record.position.topic.as_ref()) {
            Some(d) => d.typed_schema(record),
            None => self.default.typed_schema(record),
        }
    }

    fn decode_typed<'r>(&self, record: &'r Record, schema: &Schema) -> Result<TypedSlots<'r>> {
        match self.by_topic.get(record.position.topic.as_ref()) {
            Some(d) => d.decode_typed(record, schema),
            None => self.default.decode_typed(record, schema),
        }
    }
}
