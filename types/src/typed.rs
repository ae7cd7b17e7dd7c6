//! The typed API's bridge: the user's serde types to and from [`Row`]s.

use crate::row::{Row, Value};
use crate::time::parse_rfc3339;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;

/// Deserializes a row into `T`; timestamps arrive as RFC 3339 strings, so
/// `chrono::DateTime<Utc>` fields work.
///
/// ```
/// #[derive(serde::Deserialize)]
/// struct Order { id: String, amount: f64 }
/// let row: tidemark_types::row::Row = [("id", "a".into()), ("amount", 2.5.into())].into_iter().collect();
/// let o: Order = tidemark_types::typed::from_row(&row).unwrap();
/// assert_eq!((o.id.as_str(), o.amount), ("a", 2.5));
/// ```
pub fn from_row<T: DeserializeOwned>(row: &Row) -> Result<T, String> {
    serde_json::from_value(row.to_json()).map_err(|e| e.to_string())
}

/// Serializes `value` into a row. Strings that are RFC 3339 timestamps become
/// timestamp values, so that a `DateTime<Utc>` field can carry event time.
pub fn to_row<T: Serialize>(value: &T) -> Result<Row, String> {
    row_of(value, true)
}

/// Serializes `value` into a row as it writes itself: every string stays a
/// string (a field holding a time-like text is not read as a time), so the
/// JSON of the row is `value`'s own JSON.
pub fn to_row_as_written<T: Serialize>(value: &T) -> Result<Row, String> {
    row_of(value, false)
}

fn row_of<T: Serialize>(value: &T, times_from_text: bool) -> Result<Row, String> {
    let json = serde_json::to_value(value).map_err(|e| e.to_string())?;
    let object = json
        .as_object()
        .ok_or_else(|| "a typed step must produce a struct or map".to_string())?;
    Ok(object
        .iter()
        .map(|(k, v)| {
            let value = match v {
                serde_json::Value::Null => Value::Null,
                serde_json::Value::Bool(b) => Value::Bool(*b),
                serde_json::Value::Number(n) => match n.as_i64() {
                    Some(i) => Value::Long(i),
                    None => Value::Double(n.as_f64().unwrap_or(f64::NAN)),
                },
                serde_json::Value::String(s) => match parse_rfc3339(s) {
                    Some(t) if times_from_text && s.len() >= 20 && s.as_bytes()[10] == b'T' => {
                        Value::Timestamp(t)
                    }
                    _ => Value::Str(Arc::from(s.as_str())),
                },
                other => Value::Str(Arc::from(other.to_string())),
            };
            (k.as_str(), value)
        })
        .collect())
}
