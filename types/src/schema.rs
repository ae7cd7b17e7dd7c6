//! Schemas of input rows and the conversion of decoded JSON into [`Row`]s.

use crate::error::{Error, Result};
use crate::record::SourcePosition;
use crate::row::{Row, Value};
use crate::time::parse_rfc3339;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The type of one column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    /// UTF-8 text.
    String,
    /// 64-bit signed integer.
    Long,
    /// 64-bit float.
    Double,
    /// true/false.
    Boolean,
    /// RFC 3339 string or epoch milliseconds on input; microseconds inside.
    Timestamp,
}

impl FieldType {
    /// Every accepted type name, for error messages.
    pub const NAMES: &'static str = "string, long, double, boolean, timestamp";
}

impl FromStr for FieldType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "string" => FieldType::String,
            "long" | "int" | "integer" | "bigint" => FieldType::Long,
            "double" | "float" => FieldType::Double,
            "boolean" | "bool" => FieldType::Boolean,
            "timestamp" => FieldType::Timestamp,
            other => {
                return Err(format!(
                    "unknown type `{other}`; allowed: {}",
                    FieldType::NAMES
                ))
            }
        })
    }
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FieldType::String => "string",
            FieldType::Long => "long",
            FieldType::Double => "double",
            FieldType::Boolean => "boolean",
            FieldType::Timestamp => "timestamp",
        })
    }
}

/// An ordered list of typed columns.
///
/// ```
/// use tidemark_types::schema::{FieldType, Schema};
/// let schema = Schema::new([("id", FieldType::String), ("amount", FieldType::Double)]);
/// let row = schema
///     .row_from_json(&serde_json::json!({"id": "a", "amount": 3}), &Default::default())
///     .unwrap();
/// assert_eq!(row.get("amount").unwrap().as_f64(), Some(3.0));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schema {
    fields: Vec<(Arc<str>, FieldType)>,
}

impl Schema {
    /// A schema from `(name, type)` pairs.
    pub fn new<N: Into<Arc<str>>>(fields: impl IntoIterator<Item = (N, FieldType)>) -> Self {
        Schema {
            fields: fields.into_iter().map(|(n, t)| (n.into(), t)).collect(),
        }
    }

    /// The columns in order.
    pub fn fields(&self) -> impl Iterator<Item = (&str, FieldType)> {
        self.fields.iter().map(|(n, t)| (n.as_ref(), *t))
    }

    /// The columns with their shared names.
    pub fn columns(&self) -> &[(Arc<str>, FieldType)] {
        &self.fields
    }

    /// The type of `name`, if present.
    pub fn field_type(&self, name: &str) -> Option<FieldType> {
        self.fields
            .iter()
            .find(|(n, _)| n.as_ref() == name)
            .map(|(_, t)| *t)
    }

    /// Whether the schema lists no column (rows then keep every JSON field,
    /// with types inferred).
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Converts a decoded JSON object into a row of this schema.
    ///
    /// Missing fields become NULL; a field of the wrong type is an error that
    /// names the record, the field and the reason. With an empty schema every
    /// field is kept with its JSON type.
    pub fn row_from_json(
        &self,
        json: &serde_json::Value,
        position: &SourcePosition,
    ) -> Result<Row> {
        let bad = |field: &str, reason: String| Error::BadRecord {
            position: position.clone(),
            field: field.to_string(),
            reason,
        };
        let object = json.as_object().ok_or_else(|| {
            bad(
                "<value>",
                format!("expected a JSON object, got {}", json_kind(json)),
            )
        })?;
        let mut row = Row::new();
        if self.fields.is_empty() {
            for (name, value) in object {
                row.set(name.as_str(), infer_value(value));
            }
            return Ok(row);
        }
        for (name, ty) in &self.fields {
            let value = match object.get(name.as_ref()) {
                None | Some(serde_json::Value::Null) => Value::Null,
                Some(v) => convert(v, *ty).map_err(|reason| bad(name, reason))?,
            };
            row.set(name.clone(), value);
        }
        Ok(row)
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn infer_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Long(i),
            None => Value::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::Str(Arc::from(s.as_str())),
        other => Value::Str(Arc::from(other.to_string())),
    }
}

/// Converts one JSON value to `ty`, or says why it cannot.
pub fn convert(v: &serde_json::Value, ty: FieldType) -> std::result::Result<Value, String> {
    use serde_json::Value as J;
    let mismatch = || format!("expected {ty}, got {}", json_kind(v));
    Ok(match (ty, v) {
        (FieldType::String, J::String(s)) => Value::Str(Arc::from(s.as_str())),
        (FieldType::String, J::Number(n)) => Value::Str(Arc::from(n.to_string())),
        (FieldType::Long, J::Number(n)) => match n.as_i64() {
            Some(i) => Value::Long(i),
            None => return Err(format!("expected long, got non-integer number {n}")),
        },
        (FieldType::Long, J::String(s)) => Value::Long(
            s.trim()
                .parse()
                .map_err(|_| format!("expected long, got string `{s}`"))?,
        ),
        (FieldType::Double, J::Number(n)) => Value::Double(n.as_f64().ok_or_else(mismatch)?),
        (FieldType::Double, J::String(s)) => Value::Double(
            s.trim()
                .parse()
                .map_err(|_| format!("expected double, got string `{s}`"))?,
        ),
        (FieldType::Boolean, J::Bool(b)) => Value::Bool(*b),
        (FieldType::Timestamp, J::String(s)) => Value::Timestamp(parse_rfc3339(s).ok_or_else(|| {
            format!("expected an RFC 3339 timestamp (e.g. 2026-01-01T10:00:00Z) or epoch milliseconds, got `{s}`")
        })?),
        (FieldType::Timestamp, J::Number(n)) => match n.as_i64() {
            Some(ms) => Value::Timestamp(ms.checked_mul(1000).ok_or("epoch milliseconds out of range")?),
            None => return Err(format!("expected epoch milliseconds, got {n}")),
        },
        _ => return Err(mismatch()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn converts_and_names_the_bad_field() {
        let schema = Schema::new([
            ("event_time", FieldType::Timestamp),
            ("id", FieldType::String),
            ("amount", FieldType::Double),
        ]);
        let pos = SourcePosition::new("in", 3, 42);
        let row = schema
            .row_from_json(&json!({"event_time": 1000, "id": "x", "amount": 1}), &pos)
            .unwrap();
        assert_eq!(row.get("event_time"), Some(&Value::Timestamp(1_000_000)));
        let err = schema
            .row_from_json(&json!({"event_time": "soon", "id": "x"}), &pos)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("in/3@42") && err.contains("event_time"),
            "{err}"
        );
        let err = schema
            .row_from_json(&json!([1]), &pos)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a JSON object"), "{err}");
    }
}
