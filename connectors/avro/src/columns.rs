//! Avro records read straight into one typed value per column, for the
//! engine's columnar route (`Decoder::decode_typed`): the datum's bytes
//! are read field by field into the values a window aggregation's Arrow
//! columns take, with no `apache_avro::types::Value` tree (which names
//! every field of every record with a fresh `String`) and no `Row`.
//!
//! Only a flat record takes this path: every field a primitive, an enum,
//! a date, time or timestamp, or a union of those whose non-null branches
//! all give one column type. Anything this reader meets that apache-avro
//! might read differently or refuse (a short datum, a bad union branch,
//! text that is not UTF-8, an over-long varint) makes it give up, and the
//! decoder reads that record with apache-avro instead, so values and
//! errors are the row path's.

use apache_avro::schema::Schema as AvroSchema;
use std::borrow::Cow;
use tidemark::decode::{Slot, TypedSlots};
use tidemark::schema::{FieldType, Schema};

/// How one field's bytes are read, by its Avro schema.
#[derive(Debug, Clone)]
enum FieldReader {
    Null,
    Boolean,
    /// `int`, `date`, `time-millis`: a long column.
    Int,
    /// `long`, `time-micros`.
    Long,
    Float,
    Double,
    String,
    /// Its symbols, by index.
    Enum(Vec<String>),
    TimestampMillis,
    TimestampMicros,
    TimestampNanos,
    /// The branches, by index.
    Union(Vec<FieldReader>),
}

impl FieldReader {
    /// The reader of a field of `schema`; `None` for what this module
    /// leaves to apache-avro.
    fn of(schema: &AvroSchema) -> Option<Self> {
        Some(match schema {
            AvroSchema::Null => FieldReader::Null,
            AvroSchema::Boolean => FieldReader::Boolean,
            AvroSchema::Int | AvroSchema::Date | AvroSchema::TimeMillis => FieldReader::Int,
            AvroSchema::Long | AvroSchema::TimeMicros => FieldReader::Long,
            AvroSchema::Float => FieldReader::Float,
            AvroSchema::Double => FieldReader::Double,
            AvroSchema::String => FieldReader::String,
            AvroSchema::Enum(e) => FieldReader::Enum(e.symbols.clone()),
            AvroSchema::TimestampMillis | AvroSchema::LocalTimestampMillis => {
                FieldReader::TimestampMillis
            }
            AvroSchema::TimestampMicros | AvroSchema::LocalTimestampMicros => {
                FieldReader::TimestampMicros
            }
            AvroSchema::TimestampNanos | AvroSchema::LocalTimestampNanos => {
                FieldReader::TimestampNanos
            }
            AvroSchema::Union(union) => FieldReader::Union(
                union
                    .variants()
                    .iter()
                    .map(FieldReader::of)
                    .collect::<Option<_>>()?,
            ),
            _ => return None,
        })
    }

    /// The column type its values have, as the row path converts them;
    /// `None` for a field that is always null or a union of two types.
    fn column_type(&self) -> Option<FieldType> {
        match self {
            FieldReader::Null => None,
            FieldReader::Boolean => Some(FieldType::Boolean),
            FieldReader::Int | FieldReader::Long => Some(FieldType::Long),
            FieldReader::Float | FieldReader::Double => Some(FieldType::Double),
            FieldReader::String | FieldReader::Enum(_) => Some(FieldType::String),
            FieldReader::TimestampMillis
            | FieldReader::TimestampMicros
            | FieldReader::TimestampNanos => Some(FieldType::Timestamp),
            FieldReader::Union(branches) => {
                let mut types = branches.iter().filter_map(FieldReader::column_type);
                let first = types.next()?;
                types.all(|t| t == first).then_some(first)
            }
        }
    }

    /// Reads one value off the front of `body`, strings up to
    /// `max_string` bytes; `None` when apache-avro should read it instead.
    fn read<'r>(&self, body: &mut &'r [u8], max_string: usize) -> Option<Slot<'r>> {
        Some(match self {
            FieldReader::Null => Slot::Null,
            FieldReader::Boolean => match take(body, 1)? {
                [0] => Slot::Bool(false),
                [1] => Slot::Bool(true),
                _ => return None,
            },
            FieldReader::Int => Slot::Long(i64::from(i32::try_from(read_long(body)?).ok()?)),
            FieldReader::Long => Slot::Long(read_long(body)?),
            FieldReader::Float => {
                let bytes = take(body, 4)?.try_into().ok()?;
                Slot::Double(f64::from(f32::from_le_bytes(bytes)))
            }
            FieldReader::Double => {
                Slot::Double(f64::from_le_bytes(take(body, 8)?.try_into().ok()?))
            }
            FieldReader::String => {
                let len = usize::try_from(read_long(body)?).ok()?;
                if len > max_string {
                    return None;
                }
                Slot::Str(Cow::Borrowed(std::str::from_utf8(take(body, len)?).ok()?))
            }
            FieldReader::Enum(symbols) => {
                let index = usize::try_from(read_long(body)?).ok()?;
                Slot::Str(Cow::Owned(symbols.get(index)?.clone()))
            }
            FieldReader::TimestampMillis => Slot::Timestamp(read_long(body)?.saturating_mul(1000)),
            FieldReader::TimestampMicros => Slot::Timestamp(read_long(body)?),
            FieldReader::TimestampNanos => Slot::Timestamp(read_long(body)? / 1000),
            FieldReader::Union(branches) => {
                let index = usize::try_from(read_long(body)?).ok()?;
                branches.get(index)?.read(body, max_string)?
            }
        })
    }
}

/// The first `len` bytes of `body`, taken off it.
fn take<'r>(body: &mut &'r [u8], len: usize) -> Option<&'r [u8]> {
    if body.len() < len {
        return None;
    }
    let (taken, rest) = body.split_at(len);
    *body = rest;
    Some(taken)
}

/// A zig-zag varint off the front of `body`. A tenth byte holding more
/// than the 64th bit is left to apache-avro (which drops those bits).
fn read_long(body: &mut &[u8]) -> Option<i64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = body.split_first()?;
        *body = rest;
        if shift == 63 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    None
}

/// A flat record schema: its columns, and how each field is read.
#[derive(Debug)]
pub(crate) struct FlatRecord {
    /// One column per field, in the record's order, typed as the row path
    /// converts the field's values.
    pub(crate) schema: Schema,
    fields: Vec<FieldReader>,
    /// The longest string apache-avro reads (its allocation limit, set
    /// once per process): a longer one is its error to give.
    max_string: usize,
}

impl FlatRecord {
    /// The flat record `avro` is, if it is one (see the module).
    pub(crate) fn of(avro: &AvroSchema) -> Option<Self> {
        let AvroSchema::Record(record) = avro else {
            return None;
        };
        let mut columns = Vec::with_capacity(record.fields.len());
        let mut fields = Vec::with_capacity(record.fields.len());
        for field in &record.fields {
            let reader = FieldReader::of(&field.schema)?;
            columns.push((field.name.as_str(), reader.column_type()?));
            fields.push(reader);
        }
        (!fields.is_empty()).then(|| FlatRecord {
            schema: Schema::new(columns),
            fields,
            max_string: apache_avro::util::max_allocation_bytes(
                apache_avro::util::DEFAULT_MAX_ALLOCATION_BYTES,
            ),
        })
    }

    /// The values of the datum `body` (after the Confluent header), one
    /// per column; `None` when apache-avro should read it instead.
    pub(crate) fn read<'r>(&self, mut body: &'r [u8]) -> Option<TypedSlots<'r>> {
        let slots = self
            .fields
            .iter()
            .map(|field| field.read(&mut body, self.max_string))
            .collect::<Option<Vec<_>>>()?;
        Some(TypedSlots::from_slots(slots))
    }
}
