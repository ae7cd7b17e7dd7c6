//! Rows of a columnar batch written as JSON objects straight from the
//! columns, byte for byte what serializing the [`Row`](crate::row::Row)
//! [`rows_of`](crate::columns::rows_of) makes of them gives (the Kafka
//! sink's JSON), without making the row: the names are escaped once per
//! batch, and each value is read from its typed array.

use crate::columns::{resolve_all, Column, Floats, Integers};
use crate::error::Result;
use crate::row::Value;
use crate::time::{format_rfc3339, Rfc3339};
use arrow_array::RecordBatch;
use std::cell::Cell;

/// Writes the rows of one batch as JSON objects.
pub struct JsonRowWriter<'a> {
    /// Each column with what comes before its value: `{"name":` for the
    /// first, `,"name":` for the others.
    columns: Vec<(Vec<u8>, Column<'a>)>,
    /// The day of the last timestamp written and its `YYYY-MM-DDT`: a
    /// batch's timestamps mostly share their day, whose civil date is then
    /// not worked out again.
    last_day: Cell<Option<(i64, [u8; 11])>>,
}

impl<'a> JsonRowWriter<'a> {
    /// A writer of `batch`'s rows; an Arrow type tidemark has no value for
    /// is an error naming the column.
    pub fn new(batch: &'a RecordBatch) -> Result<Self> {
        let columns = resolve_all(batch)?
            .into_iter()
            .enumerate()
            .map(|(at, (name, column))| {
                let mut prefix = vec![if at == 0 { b'{' } else { b',' }];
                write_str(&mut prefix, &name);
                prefix.push(b':');
                (prefix, column)
            })
            .collect();
        Ok(JsonRowWriter {
            columns,
            last_day: Cell::new(None),
        })
    }

    /// Appends row `i` as one JSON object to `out`.
    pub fn write_row(&self, i: usize, out: &mut Vec<u8>) {
        if self.columns.is_empty() {
            out.extend_from_slice(b"{}");
            return;
        }
        for (prefix, column) in &self.columns {
            out.extend_from_slice(prefix);
            match column {
                Column::Timestamp(_) if !column.is_null(i) => {
                    if let Value::Timestamp(t) = column.value(i) {
                        self.write_timestamp(out, t);
                    }
                }
                _ => write_value(column, i, out),
            }
        }
        out.push(b'}');
    }
}

impl JsonRowWriter<'_> {
    /// `t` as `Value::Timestamp`'s serialization writes it
    /// ([`Rfc3339::of`]), the date taken from the last one when the day is
    /// the same.
    fn write_timestamp(&self, out: &mut Vec<u8>, t: i64) {
        let (seconds, sub) = (t.div_euclid(1_000_000), t.rem_euclid(1_000_000));
        let (day, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
        let date = match self.last_day.get() {
            Some((last, date)) if last == day => date,
            _ => {
                let Some(text) = Rfc3339::of(t) else {
                    return write_str(out, &format_rfc3339(t));
                };
                let mut date = [0u8; 11];
                date.copy_from_slice(&text.as_str().as_bytes()[..11]);
                self.last_day.set(Some((day, date)));
                date
            }
        };
        out.push(b'"');
        out.extend_from_slice(&date);
        let two = |out: &mut Vec<u8>, n: i64| {
            out.extend_from_slice(&[b'0' + (n / 10) as u8, b'0' + (n % 10) as u8])
        };
        two(out, of_day / 3_600);
        out.push(b':');
        two(out, of_day / 60 % 60);
        out.push(b':');
        two(out, of_day % 60);
        let digits = |out: &mut Vec<u8>, n: i64, width: u32| {
            out.push(b'.');
            for power in (0..width).rev() {
                out.push(b'0' + (n / 10i64.pow(power) % 10) as u8);
            }
        };
        if sub % 1_000 == 0 && sub != 0 {
            digits(out, sub / 1_000, 3);
        } else if sub != 0 {
            digits(out, sub, 6);
        }
        out.extend_from_slice(b"Z\"");
    }
}

/// Row `i` of `column` as JSON, as `Value`'s serialization writes it.
fn write_value(column: &Column<'_>, i: usize, out: &mut Vec<u8>) {
    if column.is_null(i) {
        out.extend_from_slice(b"null");
        return;
    }
    match column {
        Column::Missing | Column::Null => out.extend_from_slice(b"null"),
        Column::Str(a) => write_str(out, a.value(i)),
        Column::LargeStr(a) => write_str(out, a.value(i)),
        Column::Bool(a) => out.extend_from_slice(if a.value(i) { b"true" } else { b"false" }),
        Column::Long(Integers::I64(a)) => write_long(out, a.value(i)),
        Column::Double(Floats::F64(a)) => write_double(out, a.value(i)),
        Column::Double(Floats::F32(a)) => write_double(out, a.value(i).into()),
        Column::Long(_) | Column::Timestamp(_) => match column.value(i) {
            Value::Long(v) => write_long(out, v),
            Value::Timestamp(t) => write_timestamp(out, t),
            _ => out.extend_from_slice(b"null"),
        },
    }
}

// Writing to a `Vec<u8>` cannot fail: the results below are empty.

fn write_str(out: &mut Vec<u8>, s: &str) {
    // serde_json's own escaping, so the bytes are the row path's.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn write_long(out: &mut Vec<u8>, v: i64) {
    let _ = serde_json::to_writer(&mut *out, &v);
}

fn write_double(out: &mut Vec<u8>, v: f64) {
    // JSON has no NaN or infinity: null, as for a row.
    match v.is_finite() {
        true => {
            let _ = serde_json::to_writer(&mut *out, &v);
        }
        false => out.extend_from_slice(b"null"),
    }
}

fn write_timestamp(out: &mut Vec<u8>, t: i64) {
    match Rfc3339::of(t) {
        Some(text) => write_str(out, text.as_str()),
        None => write_str(out, &format_rfc3339(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::rows_of;
    use arrow_array::{
        ArrayRef, BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array,
        LargeStringArray, NullArray, StringArray, TimestampMicrosecondArray,
        TimestampMillisecondArray, TimestampNanosecondArray,
    };
    use proptest::prelude::*;
    use std::sync::Arc;

    /// What the Kafka sink wrote for the row before: serde_json of the row.
    fn via_rows(batch: &RecordBatch) -> Vec<String> {
        rows_of(batch)
            .unwrap()
            .iter()
            .map(|row| serde_json::to_string(row).unwrap())
            .collect()
    }

    fn via_columns(batch: &RecordBatch) -> Vec<String> {
        let writer = JsonRowWriter::new(batch).unwrap();
        (0..batch.num_rows())
            .map(|i| {
                let mut out = Vec::new();
                writer.write_row(i, &mut out);
                String::from_utf8(out).unwrap()
            })
            .collect()
    }

    fn text() -> impl Strategy<Value = Option<String>> {
        prop::option::of(prop_oneof![
            "[a-z]{0,6}",
            "\\PC{0,6}",
            Just("\"\\\n\t\u{0}\u{1f}é😀".to_string()),
        ])
    }

    fn double() -> impl Strategy<Value = Option<f64>> {
        prop::option::of(prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(-0.0),
            Just(1.0),
            Just(1e21),
            Just(0.1),
        ])
    }

    fn timestamp() -> impl Strategy<Value = Option<i64>> {
        prop::option::of(prop_oneof![
            -62_135_596_800_000_000i64..253_402_300_800_000_000,
            any::<i64>(),
            // Two days and the midnight between: rows that share a day.
            1_767_225_600_000_000i64..1_767_398_400_000_000,
            (1_767_225_600i64..1_767_398_400).prop_map(|s| s * 1_000_000),
            (1_767_225_600_000i64..1_767_398_400_000).prop_map(|ms| ms * 1_000),
        ])
    }

    fn batch_of(n: usize, columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        if columns.is_empty() {
            let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(n));
            return RecordBatch::try_new_with_options(
                Arc::new(arrow_schema::Schema::empty()),
                vec![],
                &options,
            )
            .unwrap();
        }
        RecordBatch::try_from_iter(columns).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Every column type the engine makes or reads, with NULLs,
        /// escapes, non-finite doubles and timestamps out of RFC 3339's
        /// range, in the row's bytes.
        #[test]
        fn rows_written_from_columns_are_the_rows_json(
            rows in prop::collection::vec(
                (text(), prop::option::of(any::<i64>()), double(), prop::option::of(any::<bool>()),
                 timestamp(), prop::option::of(any::<i32>()), prop::option::of(any::<f32>()),
                 prop::option::of(any::<i64>())),
                0..12),
            with_columns in any::<bool>(),
        ) {
            let n = rows.len();
            let columns: Vec<(&str, ArrayRef)> = if !with_columns { vec![] } else { vec![
                ("s", Arc::new(rows.iter().map(|r| r.0.clone()).collect::<StringArray>())),
                ("ls", Arc::new(rows.iter().map(|r| r.0.clone()).collect::<LargeStringArray>())),
                ("l", Arc::new(rows.iter().map(|r| r.1).collect::<Int64Array>())),
                ("d", Arc::new(rows.iter().map(|r| r.2).collect::<Float64Array>())),
                ("b", Arc::new(rows.iter().map(|r| r.3).collect::<BooleanArray>())),
                ("t", Arc::new(rows.iter().map(|r| r.4).collect::<TimestampMicrosecondArray>().with_timezone("UTC"))),
                ("i", Arc::new(rows.iter().map(|r| r.5).collect::<Int32Array>())),
                ("f", Arc::new(rows.iter().map(|r| r.6).collect::<Float32Array>())),
                ("ms", Arc::new(rows.iter().map(|r| r.7).collect::<TimestampMillisecondArray>())),
                ("ns", Arc::new(rows.iter().map(|r| r.7).collect::<TimestampNanosecondArray>())),
                ("nothing", Arc::new(NullArray::new(n))),
                ("a \"quoted\"\nname é", Arc::new(rows.iter().map(|r| r.1).collect::<Int64Array>())),
                ("l2", Arc::new(rows.iter().map(|r| r.5.map(i64::from)).collect::<Int64Array>())),
            ]};
            let batch = batch_of(n, columns);
            prop_assert_eq!(via_columns(&batch), via_rows(&batch));
        }
    }
}
