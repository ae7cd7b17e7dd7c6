//! Avro in the Confluent wire format: magic byte 0, a 4-byte big-endian
//! schema id, then the Avro binary datum. Schemas come from a schema registry
//! (`GET /schemas/ids/{id}`, see [`RegistryClient`]) or local `.avsc` files.
#![deny(missing_docs)]

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::Schema as AvroSchema;
use apache_avro::types::Value as AvroValue;
use apache_avro::writer::datum::GenericDatumWriter;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tidemark::decode::{Slot, TypedSlots};
use tidemark::error::{Error, Result};
use tidemark::record::{Record, SourcePosition};
use tidemark::row::{Row, Value};
use tidemark::runtime::Decoder;
use tidemark::schema::Schema;

mod columns;
mod registry;
mod write;
use columns::FlatRecord;

pub use registry::{RegistryClient, RegistryConfig, SchemaLookup, SubjectNameStrategy};

/// Parses an `.avsc` file.
pub fn read_schema_file(path: &Path) -> Result<AvroSchema> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    AvroSchema::parse_str(&text)
        .map_err(|e| Error::config("avro_schemas", format!("{}: {e}", path.display())))
}

/// Decodes Confluent-framed Avro records into rows.
///
/// An unknown schema id, a wrong magic byte or a datum that does not match
/// its schema is a bad record naming the position and the reason; a
/// registry that cannot answer holds the batch back (a source error), one
/// that refuses the client is a configuration error.
pub struct AvroDecoder {
    schemas: HashMap<u32, Arc<AvroSchema>>,
    /// A datum reader per schema id, built at the id's first record.
    readers: HashMap<u32, SchemaReader>,
    /// The ids among them whose schema is a flat record, read straight
    /// into columns for the columnar route. Boxed: the router tells
    /// schemas apart by address within a poll, so a schema must not move
    /// when the map grows.
    flat_records: HashMap<u32, Box<FlatRecord>>,
    registry: Option<RegistryClient>,
}

/// A writer schema and the datum reader built for it once: building one
/// resolves every name of the schema into a map, a fifth of a record's
/// decode when it was done per record. The reader borrows the schema.
#[ouroboros::self_referencing]
struct SchemaReader {
    schema: Arc<AvroSchema>,
    #[borrows(schema)]
    #[covariant]
    reader: GenericDatumReader<'this>,
}

impl AvroDecoder {
    /// A decoder with known schemas by id and an optional registry for the
    /// ids it does not know (each fetched once, then cached).
    pub fn new(schemas: HashMap<u32, AvroSchema>, registry: Option<RegistryClient>) -> Self {
        AvroDecoder {
            schemas: schemas.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(),
            readers: HashMap::new(),
            flat_records: HashMap::new(),
            registry,
        }
    }

    /// The writer schema `id`: known, or fetched from the registry.
    fn schema(&mut self, id: u32) -> std::result::Result<Arc<AvroSchema>, SchemaLookup> {
        if let Some(s) = self.schemas.get(&id) {
            return Ok(s.clone());
        }
        let Some(registry) = &self.registry else {
            return Err(SchemaLookup::Unknown(format!(
                "unknown schema id {id} (no schema registry configured)"
            )));
        };
        let schema = Arc::new(registry.schema_by_id(id)?);
        self.schemas.insert(id, schema.clone());
        Ok(schema)
    }
}

fn bad(position: &SourcePosition, field: &str, reason: String) -> Error {
    Error::BadRecord {
        position: position.clone(),
        field: field.to_string(),
        reason,
    }
}

impl AvroDecoder {
    /// The schema id and the datum of a Confluent-framed `record`, or why
    /// it is not one.
    fn framed<'r>(&self, record: &'r Record) -> Result<(u32, &'r [u8])> {
        let position = &record.position;
        let bytes = record.value.as_deref().ok_or_else(|| {
            bad(
                position,
                "<value>",
                "the record has no value (tombstone)".into(),
            )
        })?;
        if bytes.len() < 5 {
            return Err(bad(
                position,
                "<value>",
                format!(
                    "{} bytes is too short for the Confluent Avro header",
                    bytes.len()
                ),
            ));
        }
        if bytes[0] != 0 {
            return Err(bad(
                position,
                "<value>",
                format!(
                    "magic byte {} is not 0: not Confluent-framed Avro",
                    bytes[0]
                ),
            ));
        }
        let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        Ok((id, &bytes[5..]))
    }

    /// Builds the datum reader of schema `id` (and its flat record, if it
    /// is one) at the id's first record.
    fn ensure_reader(&mut self, id: u32, position: &SourcePosition) -> Result<()> {
        if self.readers.contains_key(&id) {
            return Ok(());
        }
        let schema = self.schema(id).map_err(|lookup| match lookup {
            SchemaLookup::Unknown(reason) => bad(position, "<schema id>", reason),
            SchemaLookup::Unavailable(reason) => Error::Source(reason),
            SchemaLookup::Refused(reason) | SchemaLookup::Unusable(reason) => {
                Error::config("schema_registry", reason)
            }
        })?;
        let reader = SchemaReader::try_new(schema.clone(), |schema| {
            GenericDatumReader::builder(schema).build()
        })
        .map_err(|e| bad(position, "<value>", format!("schema id {id}: {e}")))?;
        self.readers.insert(id, reader);
        if let Some(flat) = FlatRecord::of(&schema) {
            self.flat_records.insert(id, Box::new(flat));
        }
        Ok(())
    }

    /// The datum `body` of schema `id` (whose reader is built) as a row.
    fn read_row(&self, id: u32, mut body: &[u8], position: &SourcePosition) -> Result<Row> {
        let Some(reader) = self.readers.get(&id) else {
            return Err(Error::Source(format!(
                "the reader of schema id {id} went missing"
            )));
        };
        let value = reader.borrow_reader().read_value(&mut body).map_err(|e| {
            bad(
                position,
                "<value>",
                format!("Avro datum does not match schema id {id}: {e}"),
            )
        })?;
        match value {
            AvroValue::Record(fields) => {
                let mut row = Row::new();
                for (name, v) in fields {
                    let converted = avro_to_value(v).map_err(|r| bad(position, &name, r))?;
                    row.set(name.as_str(), converted);
                }
                Ok(row)
            }
            other => Err(bad(
                position,
                "<value>",
                format!("expected an Avro record, got {other:?}"),
            )),
        }
    }
}

impl Decoder for AvroDecoder {
    fn decode(&mut self, record: &Record) -> Result<Row> {
        let (id, body) = self.framed(record)?;
        self.ensure_reader(id, &record.position)?;
        self.read_row(id, body, &record.position)
    }

    /// The columns of a flat record schema (see [`columns`]) whose reader
    /// an earlier record built; the first record of an id takes the row
    /// path, which builds it.
    fn typed_schema(&self, record: &Record) -> Option<&Schema> {
        let (id, _) = self.framed(record).ok()?;
        self.flat_records.get(&id).map(|flat| &flat.schema)
    }

    fn decode_typed<'r>(&self, record: &'r Record, schema: &Schema) -> Result<TypedSlots<'r>> {
        let (id, body) = self.framed(record)?;
        if let Some(slots) = self.flat_records.get(&id).and_then(|flat| flat.read(body)) {
            return Ok(slots);
        }
        // What the direct read left alone: apache-avro's row, or its error.
        let row = self.read_row(id, body, &record.position)?;
        Ok(TypedSlots::from_slots(
            schema
                .columns()
                .iter()
                .map(|(name, _)| slot_of(row.get(name)))
                .collect(),
        ))
    }
}

/// A row's value as a column's.
fn slot_of(value: Option<&Value>) -> Slot<'static> {
    match value {
        Some(Value::Long(v)) => Slot::Long(*v),
        Some(Value::Double(v)) => Slot::Double(*v),
        Some(Value::Bool(v)) => Slot::Bool(*v),
        Some(Value::Timestamp(v)) => Slot::Timestamp(*v),
        Some(Value::Str(s)) => Slot::Str(std::borrow::Cow::Owned(s.to_string())),
        _ => Slot::Null,
    }
}

fn avro_to_value(v: AvroValue) -> std::result::Result<Value, String> {
    Ok(match v {
        AvroValue::Null => Value::Null,
        AvroValue::Boolean(b) => Value::Bool(b),
        AvroValue::Int(i) | AvroValue::Date(i) | AvroValue::TimeMillis(i) => Value::Long(i as i64),
        AvroValue::Long(i) | AvroValue::TimeMicros(i) => Value::Long(i),
        AvroValue::Float(f) => Value::Double(f as f64),
        AvroValue::Double(f) => Value::Double(f),
        AvroValue::String(s) | AvroValue::Enum(_, s) => Value::Str(Arc::from(s.as_str())),
        AvroValue::TimestampMillis(ms) | AvroValue::LocalTimestampMillis(ms) => {
            Value::Timestamp(ms.saturating_mul(1000))
        }
        AvroValue::TimestampMicros(us) | AvroValue::LocalTimestampMicros(us) => {
            Value::Timestamp(us)
        }
        AvroValue::TimestampNanos(ns) | AvroValue::LocalTimestampNanos(ns) => {
            Value::Timestamp(ns / 1000)
        }
        AvroValue::Union(_, inner) => avro_to_value(*inner)?,
        AvroValue::Uuid(u) => Value::Str(Arc::from(u.to_string())),
        other => return Err(format!("unsupported Avro value {other:?}")),
    })
}

/// Encodes rows as Confluent-framed Avro with a fixed schema and id.
pub struct AvroEncoder {
    schema: AvroSchema,
    id: u32,
}

impl AvroEncoder {
    /// An encoder writing `schema` (a record schema) with header id `id`.
    pub fn new(schema: AvroSchema, id: u32) -> Result<Self> {
        if !matches!(schema, AvroSchema::Record(_)) {
            return Err(Error::config(
                "sink.avro_schema",
                "the Avro schema must be a record",
            ));
        }
        Ok(AvroEncoder { schema, id })
    }

    /// One row's bytes.
    pub fn encode(&self, row: &Row) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.encode_into(row, &mut out)?;
        Ok(out)
    }

    /// Appends one row's bytes to `out`: straight from the values
    /// (`write.rs`), or, for anything that writer leaves alone, through
    /// apache-avro's value tree and writer, which names what does not fit.
    pub fn encode_into(&self, row: &Row, out: &mut Vec<u8>) -> Result<()> {
        self.encode_fields_into(
            |name| row.get(name).cloned().unwrap_or(Value::Null),
            || row.clone(),
            out,
        )
    }

    /// The columns a record of this schema is written from, in order.
    pub fn field_names(&self) -> Vec<&str> {
        match &self.schema {
            AvroSchema::Record(record) => record.fields.iter().map(|f| f.name.as_str()).collect(),
            _ => Vec::new(),
        }
    }

    /// [`AvroEncoder::encode_into`] for a record read column by column:
    /// `value_of(name)` is its value of column `name` (NULL when it has
    /// none), and `row()` the whole row, made only when apache-avro has to
    /// write it.
    pub fn encode_fields_into(
        &self,
        value_of: impl Fn(&str) -> Value,
        row: impl FnOnce() -> Row,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let AvroSchema::Record(record) = &self.schema else {
            return Err(Error::Sink("the Avro schema must be a record".into()));
        };
        let start = out.len();
        out.push(0);
        out.extend(self.id.to_be_bytes());
        for field in &record.fields {
            let value = value_of(&field.name);
            if write::write_value(out, &value, &field.schema).is_none() {
                out.truncate(start);
                return self.encode_through_tree(&row(), out);
            }
        }
        Ok(())
    }

    /// [`AvroEncoder::encode_into`] through apache-avro.
    fn encode_through_tree(&self, row: &Row, out: &mut Vec<u8>) -> Result<()> {
        let AvroSchema::Record(record) = &self.schema else {
            return Err(Error::Sink("the Avro schema must be a record".into()));
        };
        let mut fields = Vec::with_capacity(record.fields.len());
        for field in &record.fields {
            let value = row.get(&field.name).cloned().unwrap_or(Value::Null);
            let avro = value_to_avro(&value, &field.schema)
                .map_err(|r| Error::Sink(format!("column `{}`: {r}", field.name)))?;
            fields.push((field.name.clone(), avro));
        }
        let writer = GenericDatumWriter::builder(&self.schema)
            .build()
            .map_err(|e| Error::sink_failed("Avro writer", e))?;
        let body = writer
            .write_value_to_vec(AvroValue::Record(fields))
            .map_err(|e| Error::sink_failed("Avro encoding", e))?;
        out.push(0);
        out.extend(self.id.to_be_bytes());
        out.extend(body);
        Ok(())
    }
}

fn value_to_avro(v: &Value, schema: &AvroSchema) -> std::result::Result<AvroValue, String> {
    Ok(match (schema, v) {
        (AvroSchema::Union(u), _) => {
            let variants = u.variants();
            let position = variants
                .iter()
                .position(|s| match (s, v) {
                    (AvroSchema::Null, Value::Null) => true,
                    (AvroSchema::Null, _) | (_, Value::Null) => false,
                    _ => value_to_avro(v, s).is_ok(),
                })
                .ok_or_else(|| format!("{} does not fit any branch of the union", v.type_name()))?;
            AvroValue::Union(
                position as u32,
                Box::new(value_to_avro(v, &variants[position])?),
            )
        }
        (AvroSchema::Null, Value::Null) => AvroValue::Null,
        (AvroSchema::Boolean, Value::Bool(b)) => AvroValue::Boolean(*b),
        (AvroSchema::Int, Value::Long(i)) => {
            AvroValue::Int(i32::try_from(*i).map_err(|_| format!("{i} does not fit an int"))?)
        }
        (AvroSchema::Long, Value::Long(i)) => AvroValue::Long(*i),
        (AvroSchema::Long, Value::Timestamp(t)) => AvroValue::Long(*t),
        (AvroSchema::Double, Value::Double(f)) => AvroValue::Double(*f),
        (AvroSchema::Double, Value::Long(i)) => AvroValue::Double(*i as f64),
        (AvroSchema::Float, Value::Double(f)) => AvroValue::Float(*f as f32),
        (AvroSchema::String, Value::Str(s)) => AvroValue::String(s.to_string()),
        (AvroSchema::String, other) if !other.is_null() => AvroValue::String(other.to_string()),
        (AvroSchema::TimestampMillis, Value::Timestamp(t)) => {
            AvroValue::TimestampMillis(t.div_euclid(1000))
        }
        (AvroSchema::TimestampMicros, Value::Timestamp(t)) => AvroValue::TimestampMicros(*t),
        (s, v) => return Err(format!("cannot write {} as {s:?}", v.type_name())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"string"},
        {"name":"amount","type":"double"},
        {"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"note","type":["null","string"],"default":null}]}"#;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
        /// Any bytes after a known schema id (random, or a valid record
        /// flipped or cut short) decode or are a bad record, never a panic
        /// (#15: a topic's bytes are input like any other).
        #[test]
        fn no_bytes_panic_the_decoder(
            tail in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            flip in 0usize..64,
            cut in 0usize..64,
        ) {
            let schema = AvroSchema::parse_str(SCHEMA).unwrap();
            let mut decoder = AvroDecoder::new([(7, schema.clone())].into_iter().collect(), None);
            let decode = |decoder: &mut AvroDecoder, bytes: Vec<u8>| {
                let record = Record {
                    value: Some(bytes),
                    position: SourcePosition::new("t", 0, 1),
                    ..Default::default()
                };
                let _ = decoder.decode(&record);
                // And straight into columns, as the columnar route reads.
                if let Some(schema) = decoder.typed_schema(&record) {
                    let _ = decoder.decode_typed(&record, schema);
                }
            };
            let mut random = vec![0, 0, 0, 0, 7];
            random.extend(&tail);
            decode(&mut decoder, random);
            let row: Row = [
                ("id", Value::from("abc")),
                ("amount", Value::from(2.5)),
                ("event_time", Value::Timestamp(1_000_000)),
                ("note", Value::from("n")),
            ]
            .into_iter()
            .collect();
            let mut valid = AvroEncoder::new(schema, 7).unwrap().encode(&row).unwrap();
            let at = 5 + flip % (valid.len() - 5);
            valid[at] ^= tail.first().copied().unwrap_or(0x80) | 1;
            decode(&mut decoder, valid.clone());
            valid.truncate(cut % (valid.len() + 1));
            decode(&mut decoder, valid);
        }
    }

    /// A flat record of every field kind the columnar read takes.
    const EVERY_KIND: &str = r#"{"type":"record","name":"All","fields":[
        {"name":"b","type":"boolean"},
        {"name":"i","type":"int"},
        {"name":"l","type":"long"},
        {"name":"f","type":"float"},
        {"name":"d","type":"double"},
        {"name":"s","type":"string"},
        {"name":"e","type":{"type":"enum","name":"Color","symbols":["RED","GREEN","BLUE"]}},
        {"name":"day","type":{"type":"int","logicalType":"date"}},
        {"name":"tm","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"tu","type":{"type":"long","logicalType":"timestamp-micros"}},
        {"name":"tn","type":{"type":"long","logicalType":"timestamp-nanos"}},
        {"name":"lt","type":{"type":"long","logicalType":"local-timestamp-millis"}},
        {"name":"ns","type":["null","string"]},
        {"name":"nl","type":["long","null"]}]}"#;

    /// One value per column, or the error's text; values as their Debug
    /// text, so that NaN equals NaN.
    type Outcome = std::result::Result<Vec<String>, String>;

    /// What `decode_typed` gives for `bytes`, and what `decode` gives as
    /// one value per column.
    fn both_routes(decoder: &mut AvroDecoder, bytes: Vec<u8>) -> (Outcome, Outcome) {
        let record = Record {
            value: Some(bytes),
            position: SourcePosition::new("t", 0, 1),
            ..Default::default()
        };
        let by_row = decoder.decode(&record);
        let schema = decoder
            .typed_schema(&record)
            .expect("a flat record's id, its reader built")
            .clone();
        let typed = decoder
            .decode_typed(&record, &schema)
            .map(|slots| {
                (0..schema.columns().len())
                    .map(|i| format!("{:?}", slots.get(i)))
                    .collect()
            })
            .map_err(|e| e.to_string());
        let by_row = by_row
            .map(|row| {
                schema
                    .columns()
                    .iter()
                    .map(|(name, _)| format!("{:?}", slot_of(row.get(name))))
                    .collect()
            })
            .map_err(|e| e.to_string());
        (typed, by_row)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// A flat record read straight into columns gives the row path's
        /// values; flipped or cut short, the row path's error too.
        #[test]
        fn columns_read_straight_from_avro_equal_the_row_path(
            b in proptest::bool::ANY,
            i in proptest::num::i32::ANY,
            l in proptest::num::i64::ANY,
            f in -1e6f32..1e6,
            d in -1e12f64..1e12,
            s in "\\PC{0,8}",
            e in 0usize..3,
            t in proptest::num::i64::ANY,
            null_branch in proptest::bool::ANY,
            flip in 0usize..256,
            mask in 1u8..=255,
            cut in 0usize..256,
        ) {
            let schema = AvroSchema::parse_str(EVERY_KIND).unwrap();
            let colors = ["RED", "GREEN", "BLUE"];
            let value = AvroValue::Record(vec![
                ("b".into(), AvroValue::Boolean(b)),
                ("i".into(), AvroValue::Int(i)),
                ("l".into(), AvroValue::Long(l)),
                ("f".into(), AvroValue::Float(f)),
                ("d".into(), AvroValue::Double(d)),
                ("s".into(), AvroValue::String(s.clone())),
                ("e".into(), AvroValue::Enum(e as u32, colors[e].into())),
                ("day".into(), AvroValue::Date(i)),
                ("tm".into(), AvroValue::TimestampMillis(t)),
                ("tu".into(), AvroValue::TimestampMicros(t)),
                ("tn".into(), AvroValue::TimestampNanos(t)),
                ("lt".into(), AvroValue::LocalTimestampMillis(t)),
                ("ns".into(), match null_branch {
                    true => AvroValue::Union(0, Box::new(AvroValue::Null)),
                    false => AvroValue::Union(1, Box::new(AvroValue::String(s))),
                }),
                ("nl".into(), match null_branch {
                    true => AvroValue::Union(1, Box::new(AvroValue::Null)),
                    false => AvroValue::Union(0, Box::new(AvroValue::Long(l))),
                }),
            ]);
            let body = GenericDatumWriter::builder(&schema)
                .build()
                .unwrap()
                .write_value_to_vec(value)
                .unwrap();
            let mut valid = vec![0, 0, 0, 0, 7];
            valid.extend(body);
            // Read straight, not by the fallback.
            let flat = FlatRecord::of(&schema).unwrap();
            proptest::prop_assert!(flat.read(&valid[5..]).is_some());
            let mut decoder = AvroDecoder::new([(7, schema)].into_iter().collect(), None);
            let (typed, by_row) = both_routes(&mut decoder, valid.clone());
            proptest::prop_assert!(typed.is_ok(), "{typed:?}");
            proptest::prop_assert_eq!(typed, by_row);
            let mut flipped = valid.clone();
            let at = 5 + flip % (flipped.len() - 5);
            flipped[at] ^= mask;
            let (typed, by_row) = both_routes(&mut decoder, flipped);
            proptest::prop_assert_eq!(typed, by_row);
            let mut short = valid;
            short.truncate(5 + cut % (short.len() - 4));
            let (typed, by_row) = both_routes(&mut decoder, short);
            proptest::prop_assert_eq!(typed, by_row);
        }
    }

    /// Bytes the direct read gives up on get the row path's outcome: a
    /// boolean byte other than 0 or 1, a varint running past 64 bits, an
    /// int out of range, an enum index past its symbols.
    #[test]
    fn a_datum_the_direct_read_leaves_alone_gets_the_row_paths_outcome() {
        let schema = AvroSchema::parse_str(
            r#"{"type":"record","name":"R","fields":[
            {"name":"b","type":"boolean"},
            {"name":"i","type":"int"},
            {"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}}]}"#,
        )
        .unwrap();
        let mut decoder = AvroDecoder::new([(7, schema)].into_iter().collect(), None);
        let framed = |body: &[u8]| [&[0, 0, 0, 0, 7][..], body].concat();
        // The first record of an id builds its reader.
        let (typed, by_row) = both_routes(&mut decoder, framed(&[1, 4, 2]));
        let expected = [Slot::Bool(true), Slot::Long(2), Slot::Str("B".into())];
        assert_eq!(
            typed,
            Ok(expected.iter().map(|s| format!("{s:?}")).collect())
        );
        assert_eq!(typed, by_row);
        let odd_bodies: [&[u8]; 4] = [
            &[2, 4, 2],
            &[
                1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0,
            ],
            &[1, 0xfe, 0xff, 0xff, 0xff, 0x1f, 0],
            &[1, 4, 4],
        ];
        for body in odd_bodies {
            let (typed, by_row) = both_routes(&mut decoder, framed(body));
            assert_eq!(typed, by_row, "{body:?}");
        }
    }

    /// A decoder that counts the records it decodes into columns, and with
    /// `rows_only` gives no typed schema (the row path).
    struct Counted {
        inner: AvroDecoder,
        rows_only: bool,
        typed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Decoder for Counted {
        fn decode(&mut self, record: &Record) -> Result<Row> {
            self.inner.decode(record)
        }
        fn typed_schema(&self, record: &Record) -> Option<&Schema> {
            (!self.rows_only).then(|| self.inner.typed_schema(record))?
        }
        fn decode_typed<'r>(&self, record: &'r Record, schema: &Schema) -> Result<TypedSlots<'r>> {
            self.typed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.decode_typed(record, schema)
        }
    }

    /// A window aggregation over Avro records: the output rows, the bad
    /// records, and how many records were decoded into columns.
    fn aggregate_avro(records: Vec<Record>, rows_only: bool) -> (Vec<Row>, u64, usize) {
        use tidemark::operators::{AggregateSpec, OutputMode};
        use tidemark::runtime::testing::{CollectSink, VecSource};
        use tidemark::runtime::{Query, Trigger};
        use tidemark::window::WindowSpec;
        let typed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let schema = AvroSchema::parse_str(SCHEMA).unwrap();
        let decoder = Counted {
            inner: AvroDecoder::new([(7, schema)].into_iter().collect(), None),
            rows_only,
            typed: typed.clone(),
        };
        let query = Query::builder("avro-columns")
            .event_time("event_time")
            .decoder(decoder)
            .window_aggregate(
                ["id"],
                WindowSpec::tumbling("1 minute").unwrap(),
                vec![
                    AggregateSpec::count(),
                    AggregateSpec::of("sum", "amount").unwrap(),
                ],
            )
            .output_mode(OutputMode::Update)
            .trigger(Trigger::AvailableNow)
            .build()
            .unwrap();
        let mut sink = CollectSink::default();
        let summary = query
            .run(&mut VecSource::record_batches(vec![records]), &mut sink)
            .unwrap();
        let typed = typed.load(std::sync::atomic::Ordering::Relaxed);
        (sink.rows, summary.bad_records, typed)
    }

    /// Avro records of a flat record schema take the engine's columnar
    /// route (after the first, which builds the reader) and give the row
    /// route's output and bad records.
    #[test]
    fn a_window_aggregation_over_avro_reads_columns_and_matches_the_row_route() {
        let encoder = AvroEncoder::new(AvroSchema::parse_str(SCHEMA).unwrap(), 7).unwrap();
        let records: Vec<Record> = (0..300i64)
            .map(|i| {
                let row: Row = [
                    ("id", Value::from(format!("u{}", i % 7).as_str())),
                    ("amount", Value::from(i as f64 / 4.0)),
                    (
                        "event_time",
                        Value::Timestamp(1_767_261_600_000_000 + i * 997_000),
                    ),
                    (
                        "note",
                        if i % 3 == 0 {
                            Value::Null
                        } else {
                            Value::from("n")
                        },
                    ),
                ]
                .into_iter()
                .collect();
                let mut value = encoder.encode(&row).unwrap();
                if i % 50 == 49 {
                    value.truncate(value.len() - 6);
                }
                Record {
                    value: Some(value),
                    position: SourcePosition::new("t", (i % 2) as i32, i),
                    ..Default::default()
                }
            })
            .collect();
        let (by_columns, bad_by_columns, typed) = aggregate_avro(records.clone(), false);
        let (by_rows, bad_by_rows, typed_by_rows) = aggregate_avro(records, true);
        assert_eq!(typed_by_rows, 0);
        // Every record but the first, whose row route builds the reader.
        assert_eq!(typed, 299);
        assert_eq!((bad_by_columns, bad_by_rows), (6, 6));
        assert!(!by_rows.is_empty());
        assert_eq!(by_columns, by_rows);
    }

    #[test]
    fn a_schema_that_is_not_a_flat_record_keeps_the_row_path() {
        let nested = AvroSchema::parse_str(
            r#"{"type":"record","name":"N","fields":[
            {"name":"tags","type":{"type":"array","items":"string"}}]}"#,
        )
        .unwrap();
        let mixed = AvroSchema::parse_str(
            r#"{"type":"record","name":"M","fields":[
            {"name":"v","type":["null","long","string"]}]}"#,
        )
        .unwrap();
        let flat = AvroSchema::parse_str(SCHEMA).unwrap();
        assert!(FlatRecord::of(&nested).is_none());
        assert!(FlatRecord::of(&mixed).is_none());
        let columns = FlatRecord::of(&flat).unwrap().schema;
        assert_eq!(
            columns
                .columns()
                .iter()
                .map(|(n, t)| (n.to_string(), *t))
                .collect::<Vec<_>>(),
            [
                ("id".to_string(), tidemark::schema::FieldType::String),
                ("amount".to_string(), tidemark::schema::FieldType::Double),
                (
                    "event_time".to_string(),
                    tidemark::schema::FieldType::Timestamp
                ),
                ("note".to_string(), tidemark::schema::FieldType::String),
            ]
        );
    }

    #[test]
    fn round_trips_and_rejects_unknown_ids() {
        let schema = AvroSchema::parse_str(SCHEMA).unwrap();
        let encoder = AvroEncoder::new(schema.clone(), 7).unwrap();
        let row: Row = [
            ("id", Value::from("a")),
            ("amount", Value::from(2.5)),
            ("event_time", Value::Timestamp(1_000_000)),
            ("note", Value::Null),
        ]
        .into_iter()
        .collect();
        let bytes = encoder.encode(&row).unwrap();
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 7]);
        let mut decoder = AvroDecoder::new([(7, schema)].into_iter().collect(), None);
        let record = Record {
            value: Some(bytes.clone()),
            position: SourcePosition::new("t", 1, 9),
            ..Default::default()
        };
        assert_eq!(decoder.decode(&record).unwrap(), row);
        let mut unknown = bytes;
        unknown[4] = 8;
        let err = decoder
            .decode(&Record {
                value: Some(unknown),
                ..record
            })
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t/1@9") && err.contains("unknown schema id 8"),
            "{err}"
        );
    }

    #[test]
    fn records_of_two_schema_ids_interleaved_each_read_by_their_own_schema() {
        let v1 = AvroSchema::parse_str(SCHEMA).unwrap();
        let v2 = AvroSchema::parse_str(
            r#"{"type":"record","name":"Order","fields":[
            {"name":"amount","type":"double"},
            {"name":"id","type":"string"},
            {"name":"qty","type":"long"}]}"#,
        )
        .unwrap();
        let first: Row = [
            ("id", Value::from("a")),
            ("amount", Value::from(2.5)),
            ("event_time", Value::Timestamp(1_000_000)),
            ("note", Value::from("n")),
        ]
        .into_iter()
        .collect();
        let second: Row = [
            ("amount", Value::from(-1.0)),
            ("id", Value::from("b")),
            ("qty", Value::from(3i64)),
        ]
        .into_iter()
        .collect();
        let encoded = [
            AvroEncoder::new(v1.clone(), 7)
                .unwrap()
                .encode(&first)
                .unwrap(),
            AvroEncoder::new(v2.clone(), 9)
                .unwrap()
                .encode(&second)
                .unwrap(),
        ];
        let mut decoder = AvroDecoder::new([(7, v1), (9, v2)].into_iter().collect(), None);
        for i in 0..6 {
            let record = Record {
                value: Some(encoded[i % 2].clone()),
                position: SourcePosition::new("t", 0, i as i64),
                ..Default::default()
            };
            let expected = if i % 2 == 0 { &first } else { &second };
            assert_eq!(&decoder.decode(&record).unwrap(), expected, "record {i}");
        }
    }

    /// A registry that does not answer is not the record's fault: the
    /// decoder fails with a source error (the batch is held back), and its
    /// text does not carry the registry's URL (which may hold credentials).
    #[test]
    fn an_unreachable_registry_is_an_infrastructure_error_not_a_bad_record() {
        // A port nothing listens on: the connection is refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://user:secret@{}", closed.local_addr().unwrap());
        drop(closed);
        let registry = RegistryClient::new(&RegistryConfig {
            url,
            properties: Default::default(),
        })
        .unwrap();
        let mut decoder = AvroDecoder::new(HashMap::new(), Some(registry));
        let record = Record {
            value: Some(vec![0, 0, 0, 0, 3, 2, b'a']),
            position: SourcePosition::new("t", 0, 1),
            ..Default::default()
        };
        let err = decoder.decode(&record).unwrap_err();
        assert!(matches!(err, Error::Source(_)), "{err}");
        assert!(!err.is_bad_data());
        assert!(!err.to_string().contains("secret"), "{err}");
        assert!(err.to_string().contains("schema id 3"), "{err}");
    }

    /// Field schemas the direct writer meets: every primitive it takes,
    /// logical timestamps, unions with null first or last or of two
    /// types, and kinds it leaves to apache-avro.
    const FIELD_SCHEMAS: &[&str] = &[
        r#""boolean""#,
        r#""int""#,
        r#""long""#,
        r#""float""#,
        r#""double""#,
        r#""string""#,
        r#"{"type":"long","logicalType":"timestamp-millis"}"#,
        r#"{"type":"long","logicalType":"timestamp-micros"}"#,
        r#"["null","string"]"#,
        r#"["long","null"]"#,
        r#"["null","int","double"]"#,
        r#"["int","string"]"#,
        r#"["null",{"type":"long","logicalType":"timestamp-millis"}]"#,
        r#"{"type":"enum","name":"E","symbols":["A","B"]}"#,
        r#"{"type":"int","logicalType":"date"}"#,
        r#""bytes""#,
    ];

    fn any_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Long),
            (-1000i64..1000).prop_map(Value::Long),
            any::<f64>().prop_map(Value::Double),
            Just(Value::Double(f64::NAN)),
            "\\PC{0,8}".prop_map(|s| Value::from(s.as_str())),
            any::<i64>().prop_map(Value::Timestamp),
            (-10_000_000i64..10_000_000).prop_map(Value::Timestamp),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Rows written straight from their values are apache-avro's bytes
        /// for the same rows, and what it refuses is refused with the same
        /// error.
        #[test]
        fn rows_written_directly_are_apache_avros_bytes(
            fields in proptest::collection::vec(
                (proptest::sample::select(FIELD_SCHEMAS), any_value(), proptest::prelude::any::<bool>()),
                1..5),
        ) {
            let schema_fields: Vec<String> = fields
                .iter()
                .enumerate()
                .map(|(i, (schema, _, _))| format!(r#"{{"name":"f{i}","type":{schema}}}"#))
                .collect();
            let schema = AvroSchema::parse_str(&format!(
                r#"{{"type":"record","name":"R","fields":[{}]}}"#,
                schema_fields.join(",")
            ))
            .unwrap();
            let encoder = AvroEncoder::new(schema, 9).unwrap();
            // A field the row lacks is NULL.
            let row: Row = fields
                .iter()
                .enumerate()
                .filter(|(_, (_, _, present))| *present)
                .map(|(i, (_, value, _))| (format!("f{i}"), value.clone()))
                .collect();
            let (mut direct, mut tree) = (vec![1, 2], vec![1, 2]);
            let direct_result = encoder.encode_into(&row, &mut direct).map_err(|e| e.to_string());
            let tree_result = encoder.encode_through_tree(&row, &mut tree).map_err(|e| e.to_string());
            proptest::prop_assert_eq!(&direct_result, &tree_result);
            if direct_result.is_ok() {
                proptest::prop_assert_eq!(direct, tree);
            } else {
                proptest::prop_assert_eq!(direct, vec![1, 2], "nothing appended on an error");
            }
        }
    }
}
