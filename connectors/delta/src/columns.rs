//! Rows to Arrow: the column types a batch of rows implies, how they meet a
//! table's schema (new nullable columns, or a refusal naming the column and
//! both types), and the record batch itself.

use deltalake::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::arrow::record_batch::RecordBatch;
use std::sync::Arc;
use tidemark::error::{Error, Result};
use tidemark::row::{Row, Value};

/// The Arrow type of a value; `None` for null (no type).
fn type_of(v: &Value) -> Option<DataType> {
    match v {
        Value::Null => None,
        Value::Bool(_) => Some(DataType::Boolean),
        Value::Long(_) => Some(DataType::Int64),
        Value::Double(_) => Some(DataType::Float64),
        Value::Timestamp(_) => Some(timestamp()),
        Value::Str(_) => Some(DataType::Utf8),
    }
}

/// Delta's `timestamp`: microseconds, UTC.
pub(crate) fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// A type name for messages, as Delta names it.
pub(crate) fn delta_name(t: &DataType) -> String {
    match t {
        DataType::Boolean => "boolean".into(),
        DataType::Int64 => "long".into(),
        DataType::Int32 => "integer".into(),
        DataType::Float64 => "double".into(),
        DataType::Float32 => "float".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Timestamp(_, Some(_)) => "timestamp".into(),
        DataType::Timestamp(_, None) => "timestamp_ntz".into(),
        DataType::Date32 => "date".into(),
        other => other.to_string(),
    }
}

/// Whether a value of type `from` can be stored in a column of type `to`.
fn fits(from: &DataType, to: &DataType) -> bool {
    from == to
        || matches!(
            (from, to),
            (DataType::Int64, DataType::Float64)
                | (DataType::Timestamp(_, _), DataType::Timestamp(_, _))
                | (DataType::Utf8, DataType::LargeUtf8 | DataType::Utf8View)
        )
}

/// The columns `rows` hold, in order of first appearance, with the type
/// their values imply (long and double together widen to double; a column
/// of nulls only is a string).
pub(crate) fn infer_schema(rows: &[Row]) -> Result<Schema> {
    let mut columns: Vec<(String, Option<DataType>)> = Vec::new();
    for row in rows {
        for (name, value) in row.columns() {
            let position = match columns.iter().position(|(n, _)| n == name) {
                Some(p) => p,
                None => {
                    columns.push((name.to_string(), None));
                    columns.len() - 1
                }
            };
            let Some(new) = type_of(value) else { continue };
            let slot = &mut columns[position].1;
            *slot = match slot.take() {
                None => Some(new),
                Some(old) if old == new => Some(old),
                Some(old) if fits(&old, &new) => Some(new),
                Some(old) if fits(&new, &old) => Some(old),
                Some(old) => {
                    return Err(Error::Sink(format!(
                        "column `{name}` holds both {} and {} values in one batch",
                        delta_name(&old),
                        delta_name(&new)
                    )))
                }
            };
        }
    }
    Ok(Schema::new(
        columns
            .into_iter()
            .map(|(name, t)| Field::new(name, t.unwrap_or(DataType::Utf8), true))
            .collect::<Vec<_>>(),
    ))
}

/// How a batch's columns meet the table's.
pub(crate) struct SchemaPlan {
    /// The schema to write: the table's, plus new columns at the end.
    pub schema: SchemaRef,
    /// Whether columns were added.
    pub widened: bool,
}

/// The schema a batch inferred as `batch` is written with into a table of
/// schema `table`: every table column (those the batch lacks are null), and
/// with `merge_schema` the batch's new columns appended as nullable. A new
/// column without `merge_schema`, or a value type the table column cannot
/// hold, is refused before anything is written.
pub(crate) fn plan_schema(
    table: &Schema,
    batch: &Schema,
    merge_schema: bool,
) -> Result<SchemaPlan> {
    let mut fields: Vec<Field> = table.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut widened = false;
    for field in batch.fields() {
        match table.field_with_name(field.name()) {
            Ok(existing) => {
                if !fits(field.data_type(), existing.data_type()) {
                    return Err(Error::Sink(format!(
                        "column `{}`: the table has {}, the rows have {}; nothing was written",
                        field.name(),
                        delta_name(existing.data_type()),
                        delta_name(field.data_type())
                    )));
                }
            }
            Err(_) if merge_schema => {
                fields.push(Field::new(field.name(), field.data_type().clone(), true));
                widened = true;
            }
            Err(_) => {
                return Err(Error::Sink(format!(
                    "column `{}` ({}) is not in the table; set `merge_schema: true` to add it, nothing was written",
                    field.name(),
                    delta_name(field.data_type())
                )))
            }
        }
    }
    for field in table.fields() {
        if !field.is_nullable() && batch.field_with_name(field.name()).is_err() {
            return Err(Error::Sink(format!(
                "column `{}` of the table is not nullable and the rows do not have it",
                field.name()
            )));
        }
    }
    Ok(SchemaPlan {
        schema: Arc::new(Schema::new(fields)),
        widened,
    })
}

/// The rows as a record batch of `schema` (types as `plan_schema` allowed).
pub(crate) fn to_record_batch(rows: &[Row], schema: &SchemaRef) -> Result<RecordBatch> {
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let name = field.name().as_str();
        let values = rows.iter().map(|r| r.get(name).unwrap_or(&Value::Null));
        let bad = |v: &Value| {
            Error::Sink(format!(
                "column `{name}`: a {} value does not fit {}",
                v.type_name(),
                delta_name(field.data_type())
            ))
        };
        let array: ArrayRef = match field.data_type() {
            DataType::Boolean => {
                let mut b = BooleanBuilder::with_capacity(rows.len());
                for v in values {
                    match v {
                        Value::Null => b.append_null(),
                        Value::Bool(x) => b.append_value(*x),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Int64 => {
                let mut b = Int64Builder::with_capacity(rows.len());
                for v in values {
                    match v {
                        Value::Null => b.append_null(),
                        Value::Long(x) => b.append_value(*x),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Float64 => {
                let mut b = Float64Builder::with_capacity(rows.len());
                for v in values {
                    match v {
                        Value::Null => b.append_null(),
                        Value::Double(x) => b.append_value(*x),
                        Value::Long(x) => b.append_value(*x as f64),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            DataType::Timestamp(TimeUnit::Microsecond, zone) => {
                let mut b = TimestampMicrosecondBuilder::with_capacity(rows.len());
                for v in values {
                    match v {
                        Value::Null => b.append_null(),
                        Value::Timestamp(x) => b.append_value(*x),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish().with_timezone_opt(zone.clone()))
            }
            DataType::Utf8 => {
                let mut b = StringBuilder::with_capacity(rows.len(), rows.len() * 8);
                for v in values {
                    match v {
                        Value::Null => b.append_null(),
                        Value::Str(s) => b.append_value(s),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            other => {
                return Err(Error::Sink(format!(
                    "column `{name}`: writing {} columns is not supported",
                    delta_name(other)
                )))
            }
        };
        arrays.push(array);
    }
    RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| Error::Sink(format!("building the record batch: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pairs: &[(&str, Value)]) -> Row {
        let mut r = Row::new();
        for (k, v) in pairs {
            r.set(*k, v.clone());
        }
        r
    }

    #[test]
    fn types_are_inferred_widened_and_checked_against_the_table() {
        let rows = vec![
            row(&[
                ("k", Value::from("a")),
                ("n", Value::Long(1)),
                ("x", Value::Null),
            ]),
            row(&[
                ("k", Value::from("b")),
                ("n", Value::Double(2.5)),
                ("t", Value::Timestamp(5)),
            ]),
        ];
        let inferred = infer_schema(&rows).unwrap();
        let types: Vec<String> = inferred
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), delta_name(f.data_type())))
            .collect();
        assert_eq!(types, ["k:string", "n:double", "x:string", "t:timestamp"]);

        let table = Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Float64, true),
        ]);
        let err = plan_schema(&table, &inferred, false)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("`x`") && err.contains("merge_schema"), "{err}");
        let plan = plan_schema(&table, &inferred, true).unwrap();
        assert!(plan.widened);
        assert_eq!(plan.schema.fields().len(), 4);
        let batch = to_record_batch(&rows, &plan.schema).unwrap();
        assert_eq!(batch.num_rows(), 2);

        let strings = Schema::new(vec![Field::new("n", DataType::Utf8, true)]);
        let err = plan_schema(&strings, &inferred, true)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("the table has string, the rows have double"),
            "{err}"
        );
    }
}
