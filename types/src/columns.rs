//! Columnar batches (Apache Arrow `RecordBatch`es) as tidemark's operators
//! read them: a column resolved once per batch to its typed array, and the
//! values of one row read from it as [`Value`]s, with the meaning a decoded
//! [`Row`] gives them.
//!
//! Arrow types map to values as the schema's field types do: `Utf8` and
//! `LargeUtf8` → string, `Int64` → long, `Float64` → double, `Boolean` →
//! bool, `Timestamp` (its zone ignored: instants) → timestamp in
//! microseconds, `Null` → null. Types a JSON decode never gives are
//! widened: the narrower integers to long, `Float32` to double (its binary
//! value: 0.1f32 reads as 0.10000000149011612, not as the text "0.1"
//! would), seconds, milliseconds and nanoseconds to microseconds. Any other
//! type is refused by [`Column::resolve`], naming the column.

use crate::error::{Error, Result};
use crate::row::{encode_key_part, encode_key_str, Row, Value};
use arrow_array::cast::AsArray;
use arrow_array::{
    Array, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array,
    LargeStringArray, RecordBatch, StringArray, TimestampMicrosecondArray,
    TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray,
};
use arrow_schema::{DataType, TimeUnit};
use std::sync::Arc;

/// One column of a batch, resolved to its typed array: reading a row's
/// value is an index, not a lookup by name, a type test or a downcast.
#[derive(Clone, Copy, Debug)]
pub enum Column<'a> {
    /// The batch has no such column: every row reads NULL, as a row
    /// without the field does.
    Missing,
    /// A column of NULLs (Arrow's `Null` type).
    Null,
    /// Text.
    Str(&'a StringArray),
    /// Text with 64-bit offsets.
    LargeStr(&'a LargeStringArray),
    /// Integers, read as long.
    Long(Integers<'a>),
    /// Floating point, read as double.
    Double(Floats<'a>),
    /// Booleans.
    Bool(&'a BooleanArray),
    /// Instants, read as microseconds.
    Timestamp(Instants<'a>),
}

/// An integer column of any width.
#[derive(Clone, Copy, Debug)]
pub enum Integers<'a> {
    /// `Int8`.
    I8(&'a Int8Array),
    /// `Int16`.
    I16(&'a Int16Array),
    /// `Int32`.
    I32(&'a Int32Array),
    /// `Int64`.
    I64(&'a Int64Array),
}

/// A floating-point column of either width.
#[derive(Clone, Copy, Debug)]
pub enum Floats<'a> {
    /// `Float32`.
    F32(&'a Float32Array),
    /// `Float64`.
    F64(&'a Float64Array),
}

/// A timestamp column of any unit.
#[derive(Clone, Copy, Debug)]
pub enum Instants<'a> {
    /// Seconds.
    Seconds(&'a TimestampSecondArray),
    /// Milliseconds.
    Millis(&'a TimestampMillisecondArray),
    /// Microseconds.
    Micros(&'a TimestampMicrosecondArray),
    /// Nanoseconds.
    Nanos(&'a TimestampNanosecondArray),
}

impl<'a> Column<'a> {
    /// The column `name` of `batch`, or [`Column::Missing`]; an Arrow type
    /// tidemark has no value for is an error naming the column and type.
    pub fn resolve(batch: &'a RecordBatch, name: &str) -> Result<Column<'a>> {
        match batch.schema_ref().index_of(name) {
            Ok(index) => Column::of(name, batch.column(index).as_ref()),
            Err(_) => Ok(Column::Missing),
        }
    }

    /// `array` as a column named `name` (the name is for the error).
    pub fn of(name: &str, array: &'a dyn Array) -> Result<Column<'a>> {
        Ok(match array.data_type() {
            DataType::Null => Column::Null,
            DataType::Utf8 => Column::Str(array.as_string::<i32>()),
            DataType::LargeUtf8 => Column::LargeStr(array.as_string::<i64>()),
            DataType::Int8 => Column::Long(Integers::I8(array.as_primitive())),
            DataType::Int16 => Column::Long(Integers::I16(array.as_primitive())),
            DataType::Int32 => Column::Long(Integers::I32(array.as_primitive())),
            DataType::Int64 => Column::Long(Integers::I64(array.as_primitive())),
            DataType::Float32 => Column::Double(Floats::F32(array.as_primitive())),
            DataType::Float64 => Column::Double(Floats::F64(array.as_primitive())),
            DataType::Boolean => Column::Bool(array.as_boolean()),
            DataType::Timestamp(TimeUnit::Second, _) => {
                Column::Timestamp(Instants::Seconds(array.as_primitive()))
            }
            DataType::Timestamp(TimeUnit::Millisecond, _) => {
                Column::Timestamp(Instants::Millis(array.as_primitive()))
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                Column::Timestamp(Instants::Micros(array.as_primitive()))
            }
            DataType::Timestamp(TimeUnit::Nanosecond, _) => {
                Column::Timestamp(Instants::Nanos(array.as_primitive()))
            }
            other => {
                return Err(Error::BadRow {
                    field: name.to_string(),
                    reason: format!(
                        "Arrow type {other} has no tidemark value (string, long, double, bool, timestamp)"
                    ),
                })
            }
        })
    }

    /// Whether row `i` is NULL (or the column is missing).
    pub fn is_null(&self, i: usize) -> bool {
        match self {
            Column::Missing | Column::Null => true,
            Column::Str(a) => a.is_null(i),
            Column::LargeStr(a) => a.is_null(i),
            Column::Bool(a) => a.is_null(i),
            Column::Long(Integers::I8(a)) => a.is_null(i),
            Column::Long(Integers::I16(a)) => a.is_null(i),
            Column::Long(Integers::I32(a)) => a.is_null(i),
            Column::Long(Integers::I64(a)) => a.is_null(i),
            Column::Double(Floats::F32(a)) => a.is_null(i),
            Column::Double(Floats::F64(a)) => a.is_null(i),
            Column::Timestamp(Instants::Seconds(a)) => a.is_null(i),
            Column::Timestamp(Instants::Millis(a)) => a.is_null(i),
            Column::Timestamp(Instants::Micros(a)) => a.is_null(i),
            Column::Timestamp(Instants::Nanos(a)) => a.is_null(i),
        }
    }

    /// Row `i`'s value.
    pub fn value(&self, i: usize) -> Value {
        if self.is_null(i) {
            return Value::Null;
        }
        match self {
            Column::Missing | Column::Null => Value::Null,
            Column::Str(a) => Value::Str(Arc::from(a.value(i))),
            Column::LargeStr(a) => Value::Str(Arc::from(a.value(i))),
            Column::Bool(a) => Value::Bool(a.value(i)),
            Column::Long(ints) => Value::Long(ints.value(i)),
            Column::Double(floats) => Value::Double(floats.value(i)),
            // Saturating: seconds and millis far from the epoch do not
            // wrap; nanoseconds are truncated toward the past, as Spark
            // casts them.
            Column::Timestamp(Instants::Seconds(a)) => {
                Value::Timestamp(a.value(i).saturating_mul(1_000_000))
            }
            Column::Timestamp(Instants::Millis(a)) => {
                Value::Timestamp(a.value(i).saturating_mul(1000))
            }
            Column::Timestamp(Instants::Micros(a)) => Value::Timestamp(a.value(i)),
            Column::Timestamp(Instants::Nanos(a)) => Value::Timestamp(a.value(i).div_euclid(1000)),
        }
    }

    /// Appends row `i`'s value to a key being encoded: the bytes
    /// [`encode_key_part`] writes for [`Column::value`], without making a
    /// string value.
    pub fn encode_key_part(&self, i: usize, out: &mut Vec<u8>) {
        match self {
            Column::Str(a) if !a.is_null(i) => encode_key_str(a.value(i), out),
            Column::LargeStr(a) if !a.is_null(i) => encode_key_str(a.value(i), out),
            _ => encode_key_part(&self.value(i), out),
        }
    }
}

impl Integers<'_> {
    /// Row `i`'s value widened to a long (whatever it holds when NULL).
    pub fn value(&self, i: usize) -> i64 {
        match self {
            Integers::I8(a) => a.value(i) as i64,
            Integers::I16(a) => a.value(i) as i64,
            Integers::I32(a) => a.value(i) as i64,
            Integers::I64(a) => a.value(i),
        }
    }

    /// Row `i`'s value, `None` when NULL.
    pub fn get(&self, i: usize) -> Option<i64> {
        let null = match self {
            Integers::I8(a) => a.is_null(i),
            Integers::I16(a) => a.is_null(i),
            Integers::I32(a) => a.is_null(i),
            Integers::I64(a) => a.is_null(i),
        };
        (!null).then(|| self.value(i))
    }
}

impl Floats<'_> {
    /// Row `i`'s value widened to a double (whatever it holds when NULL).
    pub fn value(&self, i: usize) -> f64 {
        match self {
            Floats::F32(a) => a.value(i) as f64,
            Floats::F64(a) => a.value(i),
        }
    }

    /// Row `i`'s value, `None` when NULL.
    pub fn get(&self, i: usize) -> Option<f64> {
        let null = match self {
            Floats::F32(a) => a.is_null(i),
            Floats::F64(a) => a.is_null(i),
        };
        (!null).then(|| self.value(i))
    }
}

/// Every column of `batch`, resolved: the way to read whole rows.
pub fn resolve_all(batch: &RecordBatch) -> Result<Vec<(Arc<str>, Column<'_>)>> {
    batch
        .schema_ref()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(field, array)| {
            Ok((
                Arc::from(field.name().as_str()),
                Column::of(field.name(), array.as_ref())?,
            ))
        })
        .collect()
}

/// Row `i` of a batch whose columns are `columns` ([`resolve_all`]), a
/// NULL kept as a NULL column, as the JSON decoder keeps an absent field.
pub fn row_at(columns: &[(Arc<str>, Column<'_>)], i: usize) -> Row {
    let mut row = Row::with_capacity(columns.len());
    for (name, column) in columns {
        row.push_new_column(name.clone(), column.value(i));
    }
    row
}

/// Row `i` of some resolved columns, read by name: how an expression
/// ([`crate::expr::Expr::eval_in`]) reads a batch without making a [`Row`].
pub struct ColumnsRow<'c, 'a> {
    /// The columns, by name (a name not among them reads as NULL).
    pub columns: &'c [(Arc<str>, Column<'a>)],
    /// The row.
    pub i: usize,
}

impl crate::expr::Fields for ColumnsRow<'_, '_> {
    fn field(&self, name: &str) -> Value {
        self.columns
            .iter()
            .find(|(n, _)| n.as_ref() == name)
            .map_or(Value::Null, |(_, column)| column.value(self.i))
    }
}

/// `values` as one Arrow array, if their types agree (NULLs fit any): an
/// array whose [`Column::value`] gives back the same values. `None` when
/// two values differ in type.
pub fn array_of(values: &[Value]) -> Option<arrow_array::ArrayRef> {
    fn all<'v, T>(
        values: &'v [Value],
        get: impl Fn(&'v Value) -> Option<T>,
    ) -> Option<Vec<Option<T>>> {
        values
            .iter()
            .map(|v| match v {
                Value::Null => Some(None),
                v => get(v).map(Some),
            })
            .collect()
    }
    let Some(first) = values.iter().find(|v| !v.is_null()) else {
        return Some(arrow_array::new_null_array(&DataType::Null, values.len()));
    };
    Some(match first {
        // `first` is not NULL: this arm only completes the match.
        Value::Null => return None,
        Value::Bool(_) => Arc::new(BooleanArray::from(all(values, |v| match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        })?)),
        Value::Long(_) => Arc::new(Int64Array::from(all(values, |v| match v {
            Value::Long(n) => Some(*n),
            _ => None,
        })?)),
        Value::Double(_) => Arc::new(Float64Array::from(all(values, |v| match v {
            Value::Double(d) => Some(*d),
            _ => None,
        })?)),
        Value::Str(_) => Arc::new(LargeStringArray::from(all(values, |v| match v {
            Value::Str(s) => Some(s.as_ref()),
            _ => None,
        })?)),
        Value::Timestamp(_) => Arc::new(
            TimestampMicrosecondArray::from(all(values, |v| match v {
                Value::Timestamp(t) => Some(*t),
                _ => None,
            })?)
            .with_timezone("UTC"),
        ),
    })
}

/// Every row of `batch`, in order.
pub fn rows_of(batch: &RecordBatch) -> Result<Vec<Row>> {
    let columns = resolve_all(batch)?;
    Ok((0..batch.num_rows()).map(|i| row_at(&columns, i)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{Field, Schema};

    fn batch() -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("n", DataType::Int32, true),
            Field::new("l", DataType::Int64, true),
            Field::new("d", DataType::Float64, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(StringArray::from(vec![Some("a"), None])),
                Arc::new(Int32Array::from(vec![Some(-3), None])),
                Arc::new(Int64Array::from(vec![Some(i64::MIN), None])),
                Arc::new(Float64Array::from(vec![Some(1.5), None])),
                Arc::new(BooleanArray::from(vec![Some(true), None])),
                Arc::new(TimestampMillisecondArray::from(vec![Some(-1), None])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn rows_read_from_columns_hold_the_values_a_decoder_gives() {
        let rows = rows_of(&batch()).unwrap();
        let first: Vec<(&str, &Value)> = rows[0].columns().collect();
        assert_eq!(
            first,
            vec![
                ("s", &Value::Str(Arc::from("a"))),
                ("n", &Value::Long(-3)),
                ("l", &Value::Long(i64::MIN)),
                ("d", &Value::Double(1.5)),
                ("b", &Value::Bool(true)),
                ("t", &Value::Timestamp(-1000)),
            ]
        );
        assert!(rows[1].columns().all(|(_, v)| v.is_null()));
    }

    #[test]
    fn narrow_integers_and_floats_widen_to_their_own_values() {
        let values: [Option<i8>; 4] = [Some(i8::MIN), Some(-1), None, Some(i8::MAX)];
        let i8s = Int8Array::from(values.to_vec());
        let i16s = Int16Array::from_iter(values.iter().map(|v| v.map(|v| i16::from(v) * 200)));
        let f32s = Float32Array::from_iter(values.iter().map(|v| v.map(|v| f32::from(v) / 3.0)));
        for (i, v) in values.iter().enumerate() {
            let column = Column::of("c", &i8s).unwrap();
            assert_eq!(
                column.value(i),
                v.map_or(Value::Null, |v| Value::Long(v.into()))
            );
            let column = Column::of("c", &i16s).unwrap();
            let expected = v.map_or(Value::Null, |v| Value::Long(i64::from(v) * 200));
            assert_eq!(column.value(i), expected);
            let column = Column::of("c", &f32s).unwrap();
            let expected = v.map_or(Value::Null, |v| Value::Double((f32::from(v) / 3.0) as f64));
            assert_eq!(column.value(i), expected);
            let (Column::Long(ints), Column::Double(floats)) = (
                Column::of("c", &i8s).unwrap(),
                Column::of("c", &f32s).unwrap(),
            ) else {
                panic!("integers read as longs, floats as doubles");
            };
            assert_eq!(ints.get(i), v.map(i64::from));
            assert_eq!(floats.get(i), v.map(|v| (f32::from(v) / 3.0) as f64));
        }
    }

    #[test]
    fn keys_encoded_from_columns_equal_keys_encoded_from_values() {
        let batch = batch();
        let columns = resolve_all(&batch).unwrap();
        for i in 0..batch.num_rows() {
            let mut from_columns = Vec::new();
            let mut values = Vec::new();
            for (_, column) in &columns {
                column.encode_key_part(i, &mut from_columns);
                values.push(column.value(i));
            }
            assert_eq!(from_columns, crate::row::encode_key(&values));
        }
    }

    #[test]
    fn values_made_an_array_read_back_as_the_same_values() {
        let cases: Vec<Vec<Value>> = vec![
            vec![Value::Long(1), Value::Null, Value::Long(i64::MIN)],
            vec![Value::Null, Value::Double(-0.5), Value::Double(f64::MAX)],
            vec![Value::Str("é".into()), Value::Null, Value::Str("".into())],
            vec![Value::Bool(false), Value::Bool(true)],
            vec![Value::Timestamp(-1), Value::Null],
            vec![Value::Null, Value::Null],
            vec![],
        ];
        for values in cases {
            let array = array_of(&values).unwrap();
            let column = Column::of("c", array.as_ref()).unwrap();
            let back: Vec<Value> = (0..values.len()).map(|i| column.value(i)).collect();
            assert_eq!(back, values);
        }
        assert!(array_of(&[Value::Long(1), Value::Double(1.0)]).is_none());
    }

    #[test]
    fn a_column_of_an_unsupported_type_is_refused_by_name() {
        let array = arrow_array::Date32Array::from(vec![1]);
        let err = Column::of("day", &array).err().unwrap().to_string();
        assert!(err.contains("day") && err.contains("Date32"), "{err}");
        let batch = batch();
        assert!(matches!(
            Column::resolve(&batch, "absent").unwrap(),
            Column::Missing
        ));
    }
}
