//! Dynamic rows: what the pipeline file's steps and the window operators see.

use crate::time::{format_rfc3339, TimestampMicros};
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// One typed value of a [`Row`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL: a missing field or an aggregate over nothing.
    Null,
    /// `boolean`.
    Bool(bool),
    /// `long`: a 64-bit signed integer.
    Long(i64),
    /// `double`: a 64-bit float.
    Double(f64),
    /// `string`.
    Str(Arc<str>),
    /// `timestamp`: microseconds since the epoch, UTC.
    Timestamp(TimestampMicros),
}

impl Value {
    /// The value as a float, for arithmetic and numeric aggregates.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Long(v) => Some(*v as f64),
            Value::Double(v) => Some(*v),
            Value::Timestamp(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// Whether this is [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The name of this value's type, as written in a pipeline schema.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Long(_) => "long",
            Value::Double(_) => "double",
            Value::Str(_) => "string",
            Value::Timestamp(_) => "timestamp",
        }
    }

    /// SQL-style comparison: numbers compare across long/double, NULL and
    /// mismatched types are unordered (`None`).
    pub fn sql_cmp(&self, other: &Value) -> Option<Ordering> {
        match (self, other) {
            (Value::Null, _) | (_, Value::Null) => None,
            (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
            (Value::Long(a), Value::Long(b)) => Some(a.cmp(b)),
            (Value::Timestamp(a), Value::Timestamp(b)) => Some(a.cmp(b)),
            (Value::Str(a), Value::Str(b)) => Some(a.cmp(b)),
            (a, b) => match (a.as_f64(), b.as_f64()) {
                (Some(x), Some(y)) => x.partial_cmp(&y),
                _ => None,
            },
        }
    }

    /// Converts to JSON; timestamps become RFC 3339 strings.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => (*b).into(),
            Value::Long(v) => (*v).into(),
            Value::Double(v) => serde_json::Number::from_f64(*v)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Str(s) => serde_json::Value::String(s.to_string()),
            Value::Timestamp(t) => serde_json::Value::String(format_rfc3339(*t)),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Long(v) => write!(f, "{v}"),
            Value::Double(v) => write!(f, "{v}"),
            Value::Str(s) => f.write_str(s),
            Value::Timestamp(t) => f.write_str(&format_rfc3339(*t)),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(Arc::from(s))
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Long(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Double(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

/// An ordered set of named values.
///
/// Rows are small (tens of columns), so a vector with linear look-up beats a
/// hash map and keeps the column order that outputs must preserve.
///
/// ```
/// use tidemark_types::row::{Row, Value};
/// let mut row = Row::new();
/// row.set("id", Value::from("a"));
/// row.set("amount", Value::from(2.5));
/// assert_eq!(row.get("amount"), Some(&Value::Double(2.5)));
/// assert_eq!(row.to_json().to_string(), r#"{"id":"a","amount":2.5}"#);
/// assert_eq!(serde_json::to_string(&row).unwrap(), r#"{"id":"a","amount":2.5}"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    columns: Vec<(Arc<str>, Value)>,
}

impl Row {
    /// An empty row.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty row with room for `columns` columns.
    pub fn with_capacity(columns: usize) -> Self {
        Row {
            columns: Vec::with_capacity(columns),
        }
    }

    /// Appends a column the caller knows the row does not have yet (a
    /// decoder filling a schema's distinct columns), without the look-up
    /// [`Row::set`] makes.
    pub fn push_new_column(&mut self, name: Arc<str>, value: Value) {
        debug_assert!(self.get(&name).is_none(), "column `{name}` twice");
        self.columns.push((name, value));
    }

    /// The value of `name`, if the row has that column.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.columns
            .iter()
            .find(|(n, _)| n.as_ref() == name)
            .map(|(_, v)| v)
    }

    /// Sets `name`, replacing its value or appending a new column.
    pub fn set(&mut self, name: impl Into<Arc<str>>, value: Value) {
        let name = name.into();
        match self.columns.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.columns.push((name, value)),
        }
    }

    /// Removes `name` and returns its value.
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        let pos = self.columns.iter().position(|(n, _)| n.as_ref() == name)?;
        Some(self.columns.remove(pos).1)
    }

    /// The columns in order.
    pub fn columns(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.columns.iter().map(|(n, v)| (n.as_ref(), v))
    }

    /// The columns in order, with their shared names: copying a column
    /// to another row this way allocates nothing for its name.
    pub fn entries(&self) -> impl Iterator<Item = (&Arc<str>, &Value)> {
        self.columns.iter().map(|(n, v)| (n, v))
    }

    /// Number of columns.
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    /// Whether the row has no column.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// The row as a JSON object, columns in order.
    pub fn to_json(&self) -> serde_json::Value {
        let mut map = serde_json::Map::with_capacity(self.columns.len());
        for (name, value) in &self.columns {
            map.insert(name.to_string(), value.to_json());
        }
        serde_json::Value::Object(map)
    }
}

impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Long(v) => s.serialize_i64(*v),
            // JSON has no NaN or infinity; they become null, as in to_json.
            Value::Double(v) if !v.is_finite() => s.serialize_unit(),
            Value::Double(v) => s.serialize_f64(*v),
            Value::Str(v) => s.serialize_str(v),
            Value::Timestamp(t) => match crate::time::Rfc3339::of(*t) {
                Some(text) => s.serialize_str(text.as_str()),
                None => s.serialize_str(&format_rfc3339(*t)),
            },
        }
    }
}

/// Serializes as an object of the columns in order, straight to the output
/// without building a JSON tree first (the Kafka sink's hot path).
impl serde::Serialize for Row {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.columns.len()))?;
        for (name, value) in &self.columns {
            map.serialize_entry(name.as_ref(), value)?;
        }
        map.end()
    }
}

impl<N: Into<Arc<str>>> FromIterator<(N, Value)> for Row {
    fn from_iter<I: IntoIterator<Item = (N, Value)>>(iter: I) -> Self {
        let mut row = Row::new();
        for (n, v) in iter {
            row.set(n, v);
        }
        row
    }
}

/// Encodes key values into bytes that compare and hash as the values do.
pub fn encode_key(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 9);
    encode_key_into(values.iter(), &mut out);
    out
}

/// [`encode_key`] into a reused buffer: the per-row path allocates nothing.
pub fn encode_key_into<'a>(values: impl Iterator<Item = &'a Value>, out: &mut Vec<u8>) {
    out.clear();
    for v in values {
        encode_key_part(v, out);
    }
}

/// Appends one key value's encoding to `out` (the step of
/// [`encode_key_into`]); columnar batches encode their keys through it too,
/// so both give the same bytes.
pub fn encode_key_part(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.push(0),
        Value::Bool(b) => out.extend([1, *b as u8]),
        Value::Long(x) => {
            out.push(2);
            out.extend(((*x as u64) ^ (1 << 63)).to_be_bytes());
        }
        Value::Double(x) => {
            out.push(3);
            out.extend(x.to_bits().to_be_bytes());
        }
        Value::Timestamp(x) => {
            out.push(4);
            out.extend(((*x as u64) ^ (1 << 63)).to_be_bytes());
        }
        Value::Str(s) => encode_key_str(s, out),
    }
}

/// The encoding of a string key value, from the text itself: a columnar
/// batch encodes its string keys without making a [`Value`] of each.
pub fn encode_key_str(text: &str, out: &mut Vec<u8>) {
    out.push(5);
    out.extend(text.as_bytes());
    out.push(0);
}
