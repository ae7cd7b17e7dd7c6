//! Schema-directed JSON decoding: a record's bytes are parsed into one
//! typed slot per schema column ([`TypedSlots`], strings borrowed from the
//! bytes), each field converted to its column's type as the parser meets
//! it, fields the schema does not name skipped without being built; the
//! slots become a [`Row`] here or are appended to Arrow columns
//! (`json_columns.rs`). No JSON tree is made on the way (it cost more than
//! half of the decode).
//!
//! The outcome is the same as parsing into a `serde_json::Value` and
//! converting it with [`crate::schema::convert`]: the same values, the same
//! errors (malformed JSON first, then the first bad field in schema order),
//! the last of duplicate keys winning.

use crate::error::{Error, Result};
use crate::record::SourcePosition;
use crate::row::{Row, Value};
use crate::schema::{convert, FieldType, Schema};
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value as Json;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// Decodes one JSON object from `bytes` into a row of `schema` (every field,
/// types inferred, when the schema is empty).
pub(crate) fn decode_row(schema: &Schema, bytes: &[u8], position: &SourcePosition) -> Result<Row> {
    let slots = match parse(schema, bytes, position)? {
        Parsed::Inferred(row) => return Ok(row),
        Parsed::Typed(slots) => checked(schema, slots, position)?,
    };
    let mut row = Row::with_capacity(schema.columns().len());
    for ((name, _), slot) in schema.columns().iter().zip(slots.into_slots()) {
        row.push_new_column(name.clone(), slot.into_value());
    }
    Ok(row)
}

/// One field of a record, parsed into its column's type; text is borrowed
/// from the record's bytes where JSON has no escapes in it.
#[derive(Debug, Clone, PartialEq)]
pub enum Slot<'a> {
    /// Absent, or JSON null.
    Null,
    /// A `long` column's value.
    Long(i64),
    /// A `double` column's value.
    Double(f64),
    /// A `boolean` column's value.
    Bool(bool),
    /// A `timestamp` column's value, in microseconds.
    Timestamp(i64),
    /// A `string` column's value.
    Str(Cow<'a, str>),
}

impl Slot<'_> {
    fn into_value(self) -> Value {
        match self {
            Slot::Null => Value::Null,
            Slot::Long(v) => Value::Long(v),
            Slot::Double(v) => Value::Double(v),
            Slot::Bool(v) => Value::Bool(v),
            Slot::Timestamp(v) => Value::Timestamp(v),
            Slot::Str(s) => Value::Str(Arc::from(s.as_ref())),
        }
    }

    fn of_value(value: Value) -> Slot<'static> {
        match value {
            Value::Long(v) => Slot::Long(v),
            Value::Double(v) => Slot::Double(v),
            Value::Bool(v) => Slot::Bool(v),
            Value::Timestamp(v) => Slot::Timestamp(v),
            Value::Str(s) => Slot::Str(Cow::Owned(s.to_string())),
            _ => Slot::Null,
        }
    }
}

/// Parses one JSON object of a typed (non-empty) `schema` into one slot
/// per column, in schema order: malformed JSON is an error first, then the
/// first bad field in schema order.
pub(crate) fn parse_typed<'a>(
    schema: &Schema,
    bytes: &'a [u8],
    position: &SourcePosition,
) -> Result<TypedSlots<'a>> {
    match parse(schema, bytes, position)? {
        Parsed::Typed(slots) => checked(schema, slots, position),
        Parsed::Inferred(_) => Err(bad(
            position,
            "<value>",
            "the schema lists no column to parse into".into(),
        )),
    }
}

/// A typed record's value per schema column, every one converted (absent
/// fields are NULL): what [`crate::runtime::Decoder::decode_typed`] gives.
pub struct TypedSlots<'a>(SlotBuffer<'a>);

type SlotBuffer<'a> = Vec<Option<Converted<'a>>>;

impl<'a> TypedSlots<'a> {
    /// The values of a record, one per schema column in schema order.
    pub fn from_slots(slots: Vec<Slot<'a>>) -> Self {
        TypedSlots(slots.into_iter().map(|slot| Some(Ok(slot))).collect())
    }

    /// Column `i`'s value (NULL past the last column).
    pub fn get(&self, i: usize) -> &Slot<'a> {
        const NULL: Slot<'static> = Slot::Null;
        match self.0.get(i) {
            Some(Some(Ok(slot))) => slot,
            _ => &NULL,
        }
    }

    /// The values in schema order.
    pub(crate) fn into_slots(self) -> impl Iterator<Item = Slot<'a>> {
        self.0.into_iter().map(|slot| match slot {
            Some(Ok(slot)) => slot,
            _ => Slot::Null,
        })
    }
}

/// The slots of a typed record, or the first field in schema order that
/// did not convert.
fn checked<'a>(
    schema: &Schema,
    mut slots: SlotBuffer<'a>,
    position: &SourcePosition,
) -> Result<TypedSlots<'a>> {
    let first_bad =
        slots
            .iter_mut()
            .zip(schema.columns())
            .find_map(|(slot, (name, _))| match slot {
                Some(Err(reason)) => Some((name, std::mem::take(reason))),
                _ => None,
            });
    match first_bad {
        Some((name, reason)) => Err(bad(position, name, reason)),
        None => Ok(TypedSlots(slots)),
    }
}

fn bad(position: &SourcePosition, field: &str, reason: String) -> Error {
    Error::BadRecord {
        position: position.clone(),
        field: field.to_string(),
        reason,
    }
}

/// The top level of a record: an object (anything else is a bad record).
fn parse<'a>(schema: &Schema, bytes: &'a [u8], position: &SourcePosition) -> Result<Parsed<'a>> {
    let malformed = |e: serde_json::Error| bad(position, "<value>", format!("malformed JSON: {e}"));
    // One UTF-8 check of the whole record is cheaper than serde_json's
    // check of each string it borrows; a record that fails it goes through
    // the byte parser, which names where (the same error as before).
    let top = match std::str::from_utf8(bytes) {
        Ok(text) => top_level(serde_json::Deserializer::from_str(text), schema),
        Err(_) => top_level(serde_json::Deserializer::from_slice(bytes), schema),
    }
    .map_err(malformed)?;
    match top {
        Decoded::NotAnObject(kind) => Err(bad(
            position,
            "<value>",
            format!("expected a JSON object, got {kind}"),
        )),
        Decoded::Inferred(row) => Ok(Parsed::Inferred(row)),
        Decoded::Typed(slots) => Ok(Parsed::Typed(slots)),
    }
}

/// The record's top level, and nothing after it but white space.
fn top_level<'de, R: serde_json::de::Read<'de>>(
    mut parser: serde_json::Deserializer<R>,
    schema: &Schema,
) -> serde_json::Result<Decoded<'de>> {
    let top = (&mut parser).deserialize_any(TopLevel { schema })?;
    parser.end()?;
    Ok(top)
}

/// A record that is an object.
enum Parsed<'a> {
    /// Every field, types inferred (empty schema).
    Inferred(Row),
    /// Per schema column: absent, or its value or why it is not one.
    Typed(SlotBuffer<'a>),
}

/// What the top level of a record held.
enum Decoded<'a> {
    /// Not an object: the kind it was, for the error.
    NotAnObject(&'static str),
    /// Every field, types inferred (empty schema).
    Inferred(Row),
    /// Per schema column: absent, or its value or why it is not one.
    Typed(SlotBuffer<'a>),
}

struct TopLevel<'s> {
    schema: &'s Schema,
}

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = Decoded<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_unit<E>(self) -> std::result::Result<Decoded<'de>, E> {
        Ok(Decoded::NotAnObject("null"))
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<Decoded<'de>, E> {
        Ok(Decoded::NotAnObject("a boolean"))
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<Decoded<'de>, E> {
        Ok(Decoded::NotAnObject("a number"))
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<Decoded<'de>, E> {
        Ok(Decoded::NotAnObject("a number"))
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<Decoded<'de>, E> {
        Ok(Decoded::NotAnObject("a number"))
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<Decoded<'de>, E> {
        Ok(Decoded::NotAnObject("a string"))
    }
    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Decoded<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Decoded::NotAnObject("an array"))
    }
    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Decoded<'de>, A::Error> {
        let columns = self.schema.columns();
        if columns.is_empty() {
            let mut row = Row::new();
            while let Some(name) = map.next_key_seed(SharedName)? {
                let value = map.next_value_seed(Inferred)?;
                row.set(name, value);
            }
            return Ok(Decoded::Inferred(row));
        }
        let mut slots = SlotBuffer::with_capacity(columns.len());
        slots.resize_with(columns.len(), || None);
        while let Some(index) = map.next_key_seed(ColumnIndex { columns })? {
            match index {
                Some(i) => slots[i] = Some(map.next_value_seed(Typed(columns[i].1))?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Decoded::Typed(slots))
    }
}

/// A field name as a shared string.
struct SharedName;

impl<'de> DeserializeSeed<'de> for SharedName {
    type Value = Arc<str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Arc<str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for SharedName {
    type Value = Arc<str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E>(self, s: &str) -> std::result::Result<Arc<str>, E> {
        Ok(Arc::from(s))
    }
}

/// The schema column a field name is, if any.
struct ColumnIndex<'s> {
    columns: &'s [(Arc<str>, FieldType)],
}

impl<'de> DeserializeSeed<'de> for ColumnIndex<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for ColumnIndex<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E>(self, s: &str) -> std::result::Result<Option<usize>, E> {
        Ok(self.columns.iter().position(|(n, _)| n.as_ref() == s))
    }
}

/// A field's value with its JSON type kept (empty schema).
struct Inferred;

impl<'de> DeserializeSeed<'de> for Inferred {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Inferred {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E>(self, b: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::Long(v))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::Double(v as f64), Value::Long))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(Value::Double(v))
    }
    fn visit_str<E>(self, s: &str) -> std::result::Result<Value, E> {
        Ok(Value::Str(Arc::from(s)))
    }
    // Nested values keep their JSON text, as before.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Value, A::Error> {
        let json = Json::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok(Value::Str(Arc::from(json.to_string())))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Value, A::Error> {
        let json = Json::deserialize(MapAccessDeserializer::new(map))?;
        Ok(Value::Str(Arc::from(json.to_string())))
    }
}

/// A field's value converted to its column's type; a value that does not
/// convert is kept as the reason, for the error in schema order.
struct Typed(FieldType);

type Converted<'a> = std::result::Result<Slot<'a>, String>;

impl<'de> DeserializeSeed<'de> for Typed {
    type Value = Converted<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Typed {
    /// The rare conversions, through a JSON value as [`convert`] takes it.
    fn convert(&self, json: &Json) -> Converted<'static> {
        convert(json, self.0).map(Slot::of_value)
    }

    /// An integer in the column types that take one as it is, as
    /// [`convert`] gives it (a double of its value, a timestamp of its
    /// epoch milliseconds); `None` for the others, which take `convert`.
    fn integer(&self, v: i64) -> Option<Slot<'static>> {
        match self.0 {
            FieldType::Long => Some(Slot::Long(v)),
            FieldType::Double => Some(Slot::Double(v as f64)),
            FieldType::Timestamp => v.checked_mul(1000).map(Slot::Timestamp),
            _ => None,
        }
    }

    fn text<'a>(&self, s: Cow<'a, str>) -> Converted<'a> {
        // The common cases without a copy of the text.
        match self.0 {
            FieldType::String => Ok(Slot::Str(s)),
            FieldType::Timestamp => match crate::time::parse_rfc3339(&s) {
                Some(t) => Ok(Slot::Timestamp(t)),
                None => self.convert(&Json::String(s.into_owned())),
            },
            _ => self.convert(&Json::String(s.into_owned())),
        }
    }
}

impl<'de> Visitor<'de> for Typed {
    type Value = Converted<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} value", self.0)
    }
    fn visit_unit<E>(self) -> std::result::Result<Converted<'de>, E> {
        Ok(Ok(Slot::Null))
    }
    fn visit_bool<E>(self, b: bool) -> std::result::Result<Converted<'de>, E> {
        Ok(self.convert(&Json::Bool(b)))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Converted<'de>, E> {
        Ok(self
            .integer(v)
            .map_or_else(|| self.convert(&Json::Number(v.into())), Ok))
    }
    // serde_json hands every non-negative integer here, not to visit_i64.
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Converted<'de>, E> {
        Ok(i64::try_from(v)
            .ok()
            .and_then(|v| self.integer(v))
            .map_or_else(|| self.convert(&Json::Number(v.into())), Ok))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Converted<'de>, E> {
        Ok(match serde_json::Number::from_f64(v) {
            Some(_) if self.0 == FieldType::Double => Ok(Slot::Double(v)),
            Some(n) => self.convert(&Json::Number(n)),
            None => Ok(Slot::Null),
        })
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> std::result::Result<Converted<'de>, E> {
        Ok(self.text(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> std::result::Result<Converted<'de>, E> {
        Ok(self.text(Cow::Owned(s.to_owned())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Converted<'de>, A::Error> {
        let json = Json::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok(self.convert(&json))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Converted<'de>, A::Error> {
        let json = Json::deserialize(MapAccessDeserializer::new(map))?;
        Ok(self.convert(&json))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn through_tree(schema: &Schema, bytes: &[u8]) -> std::result::Result<Row, String> {
        let position = SourcePosition::new("t", 0, 7);
        match serde_json::from_slice::<Json>(bytes) {
            Err(e) => Err(format!("malformed JSON: {e}")),
            Ok(json) => schema
                .row_from_json(&json, &position)
                .map_err(|e| e.to_string()),
        }
    }

    fn streamed(schema: &Schema, bytes: &[u8]) -> std::result::Result<Row, String> {
        let position = SourcePosition::new("t", 0, 7);
        decode_row(schema, bytes, &position).map_err(|e| match e {
            Error::BadRecord { reason, .. } if reason.starts_with("malformed") => reason,
            other => other.to_string(),
        })
    }

    /// A schema with a column of every type.
    pub(crate) fn typed() -> Schema {
        Schema::new([
            ("event_time", FieldType::Timestamp),
            ("id", FieldType::String),
            ("amount", FieldType::Double),
            ("n", FieldType::Long),
            ("ok", FieldType::Boolean),
        ])
    }

    #[test]
    fn same_rows_and_errors_as_through_a_json_tree() {
        let cases: &[&str] = &[
            r#"{"event_time":"2026-01-01T10:00:00.250Z","id":"a","amount":2.5,"n":3,"ok":true}"#,
            r#"{"id":7,"amount":"1.5","n":"42","event_time":1767261600000,"extra":[1,{"a":2}]}"#,
            r#"{"id":"a","id":"b","n":1,"n":2}"#,
            r#"{"n":1.5,"amount":"x"}"#,
            r#"{"event_time":"soon","n":"x"}"#,
            r#"{"ok":"yes"}"#,
            r#"{"n":18446744073709551615}"#,
            // Integers into every column type, either sign, at the edges.
            r#"{"event_time":0,"amount":3,"n":5,"id":12}"#,
            r#"{"event_time":-1000,"amount":-3,"n":-5,"id":-12}"#,
            r#"{"event_time":9223372036854775807}"#,
            r#"{"amount":18446744073709551615,"n":9223372036854775807}"#,
            r#"{"n":-9223372036854775808,"amount":-9223372036854775808}"#,
            r#"{"ok":1}"#,
            r#"{"id":{"nested":true}}"#,
            r#"{"id":null,"event_time":null}"#,
            r#"[1,2]"#,
            r#""text""#,
            r#"12"#,
            r#"null"#,
            r#"{"id":"a""#,
            r#"{"id":"a"} trailing"#,
            r#"{"id":"\u00e9t\u00e9"}"#,
            r#"{"event_time":"2026-01-01T10:00:00+02:00"}"#,
            r#""#,
        ];
        // Not UTF-8: in a column's value, in a name.
        let not_utf8: &[&[u8]] = &[b"{\"id\":\"a\xffb\"}", b"{\"i\xffd\":\"a\"}"];
        let cases = cases
            .iter()
            .map(|c| c.as_bytes())
            .chain(not_utf8.iter().copied());
        for schema in [typed(), Schema::default()] {
            for case in cases.clone() {
                assert_eq!(
                    streamed(&schema, case),
                    through_tree(&schema, case),
                    "{}",
                    String::from_utf8_lossy(case)
                );
            }
        }
    }

    #[test]
    fn the_bytes_of_a_field_outside_the_schema_are_skipped_unread() {
        // Where the tree refuses the whole record, the typed decoder never
        // reads an ignored field's text, UTF-8 or not.
        let record = b"{\"other\":\"\xff\",\"id\":\"a\"}";
        let row = streamed(&typed(), record).expect("decodes");
        assert_eq!(row.get("id"), Some(&Value::Str("a".into())));
    }

    fn json_value() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<i64>().prop_map(|v| Json::Number(v.into())),
            any::<u64>().prop_map(|v| Json::Number(v.into())),
            // Integers a timestamp column takes as epoch milliseconds.
            (-4_000_000_000_000i64..4_000_000_000_000).prop_map(|v| Json::Number(v.into())),
            (-1e12f64..1e12)
                .prop_map(|v| serde_json::Number::from_f64(v).map_or(Json::Null, Json::Number)),
            "[a-z0-9 :.TZ-]{0,24}".prop_map(Json::String),
            (0i64..4_000_000_000_000)
                .prop_map(|ms| Json::String(crate::time::format_rfc3339(ms * 1000))),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop::collection::vec(inner, 0..3).prop_map(Json::Array)
        })
    }

    proptest! {
        #[test]
        fn any_object_decodes_as_through_a_json_tree(
            fields in prop::collection::vec(
                (prop_oneof![Just("event_time"), Just("id"), Just("amount"), Just("n"),
                             Just("ok"), Just("other")], json_value()),
                0..8,
            )
        ) {
            let mut text = String::from("{");
            for (i, (name, value)) in fields.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(&format!("{:?}:{}", name, value));
            }
            text.push('}');
            for schema in [typed(), Schema::default()] {
                prop_assert_eq!(
                    streamed(&schema, text.as_bytes()),
                    through_tree(&schema, text.as_bytes())
                );
            }
        }
    }
}
